"""Sizes from a header or from metadata are bounded before they drive an allocation or a
loop, and the error names the limit.

The memory cases run in a fresh interpreter under ``RLIMIT_AS`` (relhelpers'
``run_cli_subprocess``): a regression fails there instead of eating the machine's memory.
"""

from __future__ import annotations

import json

import numpy as np
from relhelpers import assert_clean_error, invoke, time_limit

import embstore

E = np.random.default_rng(5).normal(size=(300, 8)).astype(np.float32)


def test_verify_refuses_norms_that_claim_2_40_rows_at_once(tmp_path):
    path = tmp_path / "t.emb"
    embstore.save(path, E).close()
    meta_path = path / "norms" / "zarr.json"
    doc = json.loads(meta_path.read_text())
    doc["shape"][0] = 2**40  # verify read 2**40 zeros (past 10 minutes)
    meta_path.write_text(json.dumps(doc))
    with time_limit(60, "verify of norms claiming 2**40 rows"):
        report = embstore.verify(path)
        res = invoke(["verify", path], seconds=60)
        with embstore.open(path) as t:  # still opens and reads; the norms are left aside
            assert t.norms_source is None
            np.testing.assert_array_equal(t[[3, 299]], E[[3, 299]])
    assert not report.ok
    assert (f"{path}/norms/zarr.json: 1099511627776 rows, more than the 300 the table's "
            "300 rows allow") in str(report)
    assert res.exit_code == 1 and "1099511627776 rows, more than the 300" in res.output
