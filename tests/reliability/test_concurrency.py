"""Readers in several processes while one writer (mode ``r+``) updates and appends rows.

Every row of the table holds one value in all its columns: row ``i`` at version ``v`` is
``i + v * 0.5``.  The writer rewrites a third of the rows per version and appends rows (at
version 0) with their keys.  Readers (with and without a row cache, refreshing now and
then) check every row they get: all columns equal (no torn row), ``value - i`` a multiple
of 0.5 between 0 and the last version (an old or a new value, never garbage), and the keys
they see name their rows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from relhelpers import TRIED

import embstore
import forked

ROWS, DIM, VERSIONS, APPEND = 3000, 8, 12, 64

WRITER = r"""
import sys, time, numpy as np, embstore
path, versions, append, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(7)
with embstore.open(path, mode="r+") as t:
    for v in range(1, versions + 1):
        n = len(t)
        ids = rng.choice(n, size=n // 3, replace=False)
        t.write(ids, np.repeat((ids + v * 0.5).astype(np.float32)[:, None], dim, axis=1))
        new = np.arange(n, n + append)
        t.append(np.repeat(new.astype(np.float32)[:, None], dim, axis=1),
                 keys=[f"k{i}" for i in new])
        time.sleep(0.02)
open(sys.argv[5], "w").close()
"""

READER = r"""
import json, os, sys, numpy as np, embstore
path, versions, done, cache, seed = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
rng = np.random.default_rng(seed)
reads = rows = refreshes = key_checks = 0
after_done = 0
with embstore.open(path, cache_bytes=int(cache)) as t:
    while after_done < 5:
        if os.path.exists(done):
            after_done += 1
        if rng.random() < 0.3:
            t.refresh()
            refreshes += 1
        n = len(t)
        ids = rng.integers(0, n, 256)
        got = t[ids]
        assert (got == got[:, :1]).all(), f"a torn row: {got[(got != got[:, :1]).any(1)][:2]}"
        d = got[:, 0].astype(np.float64) - ids
        ok = (d >= 0) & (d <= versions * 0.5) & (d * 2 == np.round(d * 2))
        assert ok.all(), f"garbage: rows {ids[~ok][:5]} hold {got[~ok, 0][:5]}"
        if t.keys is not None:
            some = ids[:8]
            assert list(t.keys[some]) == [f"k{i}" for i in some]
            np.testing.assert_array_equal(t.ids_of([f"k{i}" for i in some]), some)
            key_checks += some.size
        reads += 1
        rows += ids.size
print(json.dumps({"reads": reads, "rows": rows, "refreshes": refreshes, "keys": key_checks,
                  "final_rows": len(t)}))
"""


def _spawn(code: str, args: list) -> forked.Child:
    """``python -c code args`` as a process forked from tests/forked.py's server."""
    return forked.start(code, *args)


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.slow  # over 5 CPU-s (2026-12-02 per-test CPU timings)
def test_readers_see_old_or_new_rows_while_a_writer_works(tmp_path, compression):
    path = tmp_path / "t"
    base = np.repeat(np.arange(ROWS, dtype=np.float32)[:, None], DIM, axis=1)
    embstore.save(path, base, keys=[f"k{i}" for i in range(ROWS)], chunk_rows=16,
                  shard_rows=256, compression=compression).close()
    done = tmp_path / "writer-done"
    readers = [_spawn(READER, [path, VERSIONS, done, cache, seed])
               for seed, cache in enumerate([0, 1 << 20, 0])]
    writer = _spawn(WRITER, [path, VERSIONS, APPEND, DIM, done])
    try:
        _, err = writer.communicate(timeout=120)
        assert writer.returncode == 0, err
        stats = []
        for r in readers:
            out, err = r.communicate(timeout=120)
            assert r.returncode == 0, err
            stats.append(json.loads(out))
    finally:
        for p in readers + [writer]:
            if p.poll() is None:
                p.kill()
                p.wait()
    TRIED[f"concurrency: reader lookups ({compression})"] += sum(s["reads"] for s in stats)
    TRIED[f"concurrency: rows checked ({compression})"] += sum(s["rows"] for s in stats)
    assert all(s["reads"] > 5 for s in stats), stats
    # the final table: every version's writes and appends, checked against a replay
    rng = np.random.default_rng(7)
    want = base[:, 0].astype(np.float64).copy()
    for v in range(1, VERSIONS + 1):
        ids = rng.choice(len(want), size=len(want) // 3, replace=False)
        want[ids] = ids + v * 0.5
        want = np.concatenate([want, np.arange(len(want), len(want) + APPEND)])
    with embstore.open(path) as t:
        got = t.to_numpy()
        assert list(t.keys) == [f"k{i}" for i in range(len(want))]
    np.testing.assert_array_equal(got, np.repeat(want.astype(np.float32)[:, None], DIM, 1))
    assert embstore.verify(path).ok


BUILDER = r"""
import sys, numpy as np, embstore
from embstore.search.ann import index_info
path, rounds, nlist = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for r in range(rounds):
    embstore.build_index(path, nlist=nlist, overwrite=True)
print("built", rounds)
"""

SEARCHER = r"""
import os, sys, numpy as np, embstore
path, done = sys.argv[1], sys.argv[2]
with embstore.open(path) as t:
    a = t.to_numpy()
searches = after = 0
while after < 3:
    after += os.path.exists(done)
    with embstore.open(path) as t:
        ids, _ = embstore.search.stream.most_similar(t, a[[3, 1200, 2999]], k=3, approx=True, ef=64)
    assert ids[:, 0].tolist() == [3, 1200, 2999], ids
    searches += 1
print("searched", searches)
"""


@pytest.mark.slow  # over 5 CPU-s (2026-12-02 per-test CPU timings)
def test_two_index_builds_and_a_searcher_at_once(tmp_path):
    """Two processes rebuild a table's approximate index over and over (nlist 24 and 32)
    while a third opens and searches it: every build succeeds (the last swap wins), every
    search finds each query's own row, and one whole index is left, no staging."""
    pytest.importorskip("faiss")
    from embstore.search.ann import index_info, index_path
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((40, 16))[rng.integers(0, 40, ROWS)]
         + 0.3 * rng.standard_normal((ROWS, 16))).astype(np.float32)
    path = tmp_path / "t"
    embstore.save(path, a).close()
    embstore.build_index(path, nlist=16)
    done = tmp_path / "done"
    searcher = _spawn(SEARCHER, [path, done])
    builders = [_spawn(BUILDER, [path, 4, n]) for n in (24, 32)]
    outs = [p.communicate(timeout=600) for p in builders]
    done.touch()
    s_out, s_err = searcher.communicate(timeout=600)
    for p, (out, err) in zip(builders, outs):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == "built 4"
    assert searcher.returncode == 0, s_err[-2000:]
    assert int(s_out.split()[1]) >= 3
    meta = index_info(path)
    assert meta["nlist"] in (24, 32) and meta["stale"] is False
    left = {p.name for p in index_path(path).parent.iterdir()}
    assert "ann" in left and left <= {"ann", "last", "versions", "readers"}, left  # no staging
    TRIED["concurrent index builds"] += 8
