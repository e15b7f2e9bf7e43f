"""The benchmark runner runs (tiny sizes, untimed), so the benchmarks never rot.

Also checks the runner's own pieces that decide what a figure means: the
synthetic word2vec file parses to exactly the values it claims, and the
comparison rows compute ratios and targets the right way round.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import data  # noqa: E402
from benchmarks.common import Measurement, ScenarioResult, absolute, compare  # noqa: E402


def _run(tmp_path, *args):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke",
                           "--data-dir", str(tmp_path / "data"), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (js,) = out.glob("*-smoke.json")
    run = json.loads(js.read_text())
    md = js.with_suffix(".md").read_text()
    assert (out / "latest-smoke.md").read_text() == md
    assert "| Scenario | embstore | peer | ratio | target | met? |" in md
    assert run["mode"] == "smoke" and run["machine"]["cpu_count"] >= 1
    assert run["versions"]["numpy"] == np.__version__
    for s in run["scenarios"]:
        assert s["status"] in ("ok", "skipped"), s
        assert not [n for n in s["notes"] if "ERROR" in n], s["notes"]
        for m in s["measurements"]:
            assert m["reps"] >= 1 and all(math.isfinite(v) and v >= 0 for v in m["values"]), m
            assert m["min"] <= m["median"] <= m["max"]
        for c in s["comparisons"]:
            assert c["met"] in (True, False, None)
    return run, md


def _methods(run, name):
    (s,) = [s for s in run["scenarios"] if s["name"] == name]
    return s, {m["method"] for m in s["measurements"]}


@pytest.mark.slow
def test_runner_smoke_in_process_scenarios(tmp_path):
    run, md = _run(tmp_path, "--only", "lookup,scale", "--only", "keys")
    assert [s["name"] for s in run["scenarios"]] == ["lookup", "scale", "keys"]
    s, methods = _methods(run, "lookup")
    assert {"np.take in RAM", "MemoryTable.lookup", "E[ids] in RAM",
            "np.load(mmap_mode='r')[ids]"} <= methods
    import embstore

    if hasattr(embstore, "open"):
        assert {"embstore on-disk, cold row cache", "embstore on-disk, warm row cache"} <= methods
        labels = {c["label"] for c in s["comparisons"]}
        assert "lookup uniform: on-disk (row cache empty) vs memmap" in labels
        warm = [m for m in s["measurements"] if m["method"] == "embstore on-disk, warm row cache"]
        assert all(m["extra"]["hit_rate"] == 1.0 for m in warm)  # every batch was seen before
    assert "lookup uniform: MemoryTable vs np.take" in md
    # a second run reuses the data already generated
    files = sorted(p.name for p in (tmp_path / "data").iterdir())
    _run(tmp_path, "--only", "scale")
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == files


@pytest.mark.slow
def test_runner_smoke_every_scenario(tmp_path):
    """The subprocess scenarios but import, which the test below runs and checks in detail
    (running it here too measured nothing new)."""
    run, _ = _run(tmp_path, "--only", "open,batch,limits")
    assert [s["name"] for s in run["scenarios"]] == ["open", "batch", "limits"]
    _, methods = _methods(run, "batch")
    assert {"in-RAM np.take + np.save", "in-RAM np.take + np.save [peak RSS]"} <= methods
    _, methods = _methods(run, "limits")
    assert "memory copy (np.copyto)" in methods


@pytest.mark.slow
def test_runner_smoke_ooc(tmp_path):
    run, md = _run(tmp_path, "--only", "ooc,ooc-zipf")
    s, methods = _methods(run, "ooc-zipf")
    assert {"embstore, no row cache", "embstore, row cache filled by traffic",
            "embstore, row cache after warm(hottest rows)"} <= methods
    assert any("warm() vs no cache, bytes read" in c["label"] for c in s["comparisons"])
    s, methods = _methods(run, "ooc")
    assert {"embstore on-disk, no row cache", "np.load(mmap_mode='r')[ids]"} <= methods
    labels = {c["label"] for c in s["comparisons"]}
    assert any("cold: MiB read <= 1.5 x ids" in x for x in labels)
    assert any("cold: embstore vs np.memmap" in x for x in labels)
    assert "cold: embstore vs np.memmap" in md


@pytest.mark.slow
def test_import_scenario_measures_binary_and_export_against_gensim(tmp_path):
    """One run: text and binary (both layouts) imports and binary and text exports, each
    side by side with gensim on the same file, the binary ones against the 2x bar."""
    pytest.importorskip("gensim.models")
    run, md = _run(tmp_path, "--only", "import")
    s, methods = _methods(run, "import")
    assert {"embstore import", "gensim load_word2vec_format", "embstore export",
            "gensim save_word2vec_format"} <= methods
    cases = {m["case"] for m in s["measurements"]}
    assert cases == {"2,000 x 16 text", "2,000 x 16 binary, C tool layout",
                     "2,000 x 16 binary, gensim layout", "2,000 x 16 binary export",
                     "2,000 x 16 text export"}
    targets = {c["label"]: c["target"] for c in s["comparisons"]}
    for label in ("import word2vec binary (C tool layout): embstore vs gensim",
                  "import word2vec binary (gensim layout): embstore vs gensim",
                  "export word2vec binary: embstore vs gensim"):
        assert targets[label] == ">= 2x faster", label
        assert f"| {label} |" in md
    assert "export word2vec text: embstore vs gensim" in targets


def test_unknown_scenario_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--only", "nope",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "unknown scenario 'nope'" in proc.stderr


def test_word2vec_file_holds_exactly_its_values(tmp_path):
    txt, npy = data.w2v_text(tmp_path, 300, 7, seed=3)
    values = np.load(npy)
    lines = txt.read_text().splitlines()
    assert lines[0] == "300 7" and len(lines) == 301
    parsed = np.array([[np.float32(x) for x in ln.split(" ")[1:]] for ln in lines[1:]])
    np.testing.assert_array_equal(parsed, values)
    assert [ln.split(" ")[0] for ln in lines[1:4]] == ["w0000000", "w0000001", "w0000002"]
    assert (values < 0).any() and (values > 0).any() and np.abs(values).max() < 10
    gensim = pytest.importorskip("gensim.models")
    kv = gensim.KeyedVectors.load_word2vec_format(str(txt))
    np.testing.assert_array_equal(kv.vectors, values)
    assert kv.index_to_key == data.keys(300).tolist()


def test_ids_are_deterministic_and_in_range():
    a = data.ids(1000, (4, 8), "zipf1.1", seed=1)
    np.testing.assert_array_equal(a, data.ids(1000, (4, 8), "zipf1.1", seed=1))
    assert a.dtype == np.int64 and a.shape == (4, 8) and a.min() >= 0 and a.max() < 1000
    z = data.ids(1000, 50_000, "zipf1.1", seed=2)
    hot = data.zipf_order(1000)  # rank r is row hot[r - 1], scattered over the table
    assert abs((z == hot[0]).mean() - data.zipf_pmf(1000, 1.1)[0]) < 0.01
    assert (z == hot[0]).mean() > 1.8 * (z == hot[1]).mean()  # 2 ** 1.1 = 2.14
    assert sorted(hot.tolist()) == list(range(1000)) and hot[0] != 0
    u = data.ids(1000, 50_000, "uniform", seed=2)
    assert abs((u < 500).mean() - 0.5) < 0.02


def _chi2_limit(df: int, z: float = 3.09) -> float:
    """The 99.9% quantile of chi-square(df) (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("rows, a", [(1000, 1.1), (20, 1.1), (200, 2.0), (500, 0.8), (300, 1.0)])
def test_truncated_zipf_matches_its_exact_pmf(rows, a):
    n = 1_000_000
    r = data.zipf_ranks(np.random.default_rng([rows, 5]), rows, a, n)
    assert r.dtype == np.int64 and r.min() >= 1 and r.max() <= rows
    f = np.bincount(r, minlength=rows + 1)[1:]
    p = np.arange(1, rows + 1, dtype=np.float64) ** -a
    p /= p.sum()  # the exact pmf, computed here independently
    chi2 = float(((f - n * p) ** 2 / (n * p)).sum())
    assert chi2 < _chi2_limit(rows - 1), chi2
    assert np.abs(f / n - p).max() < 5 * math.sqrt(p[0] * (1 - p[0]) / n)


def test_truncated_zipf_over_a_big_table_never_folds_back():
    """90M rows: P(rank > 1M) is the exact tail mass (the old ``zipf % rows`` put 15-19% of
    its draws past 90M and folded them back over the table)."""
    rows, n = 90_000_000, 400_000
    r = data.zipf_ranks(np.random.default_rng(3), rows, 1.1, n)
    assert r.min() >= 1 and r.max() <= rows
    k = np.arange(1, 10_000_001, dtype=np.float64) ** -1.1
    head, mid = k[:1_000_000].sum(), k.sum()
    tail = sum((np.arange(s, min(s + 10_000_000, rows + 1), dtype=np.float64) ** -1.1).sum()
               for s in range(10_000_001, rows + 1, 10_000_000))
    over = (mid + tail - head) / (mid + tail)
    got = float((r > 1_000_000).mean())
    assert abs(got - over) < 5 * math.sqrt(over * (1 - over) / n), (got, over)


def test_comparisons_compute_ratios_the_right_way_round():
    res = ScenarioResult("x", "x")
    emb = Measurement("c", "emb", "embstore", "ms", [2.0, 3.0, 4.0])
    peer = Measurement("c", "peer", "peer", "ms", [300.0])
    c = compare(res, "faster", emb, peer, target=("faster", 100))
    assert c.ratio == pytest.approx(100.0) and c.met and c.ratio_text == "100x faster"
    c = compare(res, "within", emb, Measurement("c", "p", "peer", "ms", [2.5]), target=("within", 1.1))
    assert c.ratio == pytest.approx(1.2) and c.met is False
    rate = Measurement("c", "r", "embstore", "ids/s", [1e6])
    c = compare(res, "at least", rate, Measurement("c", "p", "peer", "ids/s", [4e6]),
                target=("atleast", 0.5))
    assert c.ratio == pytest.approx(0.25) and c.met is False
    c = absolute(res, "rss", Measurement("c", "m", "embstore", "MB", [120.0, 250.0]), at_most=300)
    assert c.met and "185 MB" in c.embstore
    assert compare(res, "missing", emb, None) is None and len(res.comparisons) == 4
