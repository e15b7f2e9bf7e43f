"""Sizes from a header or from metadata are bounded before they drive an allocation or a
loop, and the error names the limit.

The memory cases run in a fresh interpreter under ``RLIMIT_AS`` (relhelpers'
``run_cli_subprocess``): a regression fails there instead of eating the machine's memory.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
from relhelpers import REPO, invoke, run_cli_subprocess, time_limit

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
    assert (f"{path}/norms/zarr.json: 1099511627776 rows, more than the 1048876 the table's "
            "300 rows allow") in str(report)
    assert res.exit_code == 1 and "1099511627776 rows, more than the 1048876" in res.output


# -- fastText .bin: header fields bounded by the file and by the words -------------------
MAGIC = 793712314


def _fasttext_bin(path, *, nwords_field=None, maxn=6, bucket_field=None, words=("ab", "cd"),
                  dim=4, bucket=3):
    """A fastText .bin (layout: embstore/formats/fasttext_bin.py), some header fields lied."""
    n = len(words)
    out = [struct.pack("<2i", MAGIC, 12),
           struct.pack("<12id", dim, 5, 5, 1, 5, 1, 2, 2,
                       bucket if bucket_field is None else bucket_field, 3, maxn, 100, 1e-4),
           struct.pack("<3iq", n if nwords_field is None else nwords_field,
                       n if nwords_field is None else nwords_field, 0, 1000),
           struct.pack("<q", -1)]
    out += [w.encode() + b"\0" + struct.pack("<qb", 7, 0) for w in words]
    out += [b"\0", struct.pack("<2q", n + bucket, dim),
            np.ones((n + bucket, dim), "<f4").tobytes(), b"\0", struct.pack("<2q", 0, dim)]
    path.write_bytes(b"".join(out))
    return path


HEADER_CASES = {
    # field -> (keyword arguments, the error's text)
    "nwords-2**31-1": ({"nwords_field": 2**31 - 1}, r"at byte offset 64: nwords 2147483647: "
                       r"the dictionary and input matrix need at least \d+ bytes, more than "
                       r"the file's \d+"),
    "bucket-2**31-1": ({"bucket_field": 2**31 - 1}, r"bucket 2147483647 x dim 4: 34359738352 "
                       r"bytes of n-gram rows, more than the file's \d+ bytes"),
    "maxn-20000": ({"maxn": 20000}, r"expected maxn \(the longest n-gram\) of at most 64 "
                   r"characters, got 20000"),
}


@pytest.mark.parametrize("case", list(HEADER_CASES), ids=list(HEADER_CASES))
def test_fasttext_bin_header_sizes_are_bounded_before_allocating(tmp_path, case):
    kw, message = HEADER_CASES[case]
    src = _fasttext_bin(tmp_path / "m.bin", **kw)
    assert src.stat().st_size < 3000
    res = run_cli_subprocess(["import", src, tmp_path / "t.emb", "--quiet"],
                             address_space=1 << 30)  # nwords 2**31-1: 16 GiB of counts
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr
    assert re.search(message, res.stderr), res.stderr
    assert not (tmp_path / "t.emb").exists()


def test_ngram_work_is_sized_by_the_longest_word_not_by_maxn():
    """500,000 two-letter words with maxn 64: ~1 GB of (characters x 64) work arrays before;
    now sized by the longest word (4 characters wrapped), under a 700 MiB address space."""
    code = ("import resource, sys, numpy as np; resource.setrlimit(resource.RLIMIT_AS, "
            "(700 << 20, 700 << 20)); from embstore.store.subword.hashing import ngram_hashes; "
            "h, c = ngram_hashes(['ab', 'cd'] * 250000, 1, 64); "
            "print(int(h.size), int(c.sum()), *h[:8].tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    gensim_ft = pytest.importorskip("gensim.models.fasttext")
    ref = [gensim_ft.ft_hash_bytes(g) for g in gensim_ft.compute_ngrams_bytes("ab", 1, 64)]
    assert len(ref) == 8  # a, b, <a, ab, b>, <ab, ab>, <ab>
    size, total, *first = map(int, out.stdout.split())
    assert (size, total) == (8 * 500000, 8 * 500000)
    assert first == ref


def test_ngram_hashes_in_groups_equal_gensim(monkeypatch):
    """Words split into groups when the work arrays would pass their bound: same hashes."""
    gensim_ft = pytest.importorskip("gensim.models.fasttext")
    from embstore.store.subword import hashing as subword

    monkeypatch.setattr(subword, "_BLOCK_ELEMENTS", 200)
    rng = np.random.default_rng(1)
    alphabet = list("abcé日😀")
    words = ["", "x" * 70] + ["".join(rng.choice(alphabet, int(k)))
                               for k in rng.integers(0, 15, 300)]
    hashes, counts = subword.ngram_hashes(words, 2, 7)
    ref = [[gensim_ft.ft_hash_bytes(g) for g in gensim_ft.compute_ngrams_bytes(w, 2, 7)]
           for w in words]
    assert counts.tolist() == [len(r) for r in ref]
    assert hashes.tolist() == [h for r in ref for h in r]


# -- vocabulary files: streamed, never read whole ------------------------------------------
def _hf_folder(path, rows=6, dim=4):
    st_numpy = pytest.importorskip("safetensors.numpy")
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": rows}))
    E = np.arange(rows * dim, dtype=np.float32).reshape(rows, dim)
    st_numpy.save_file({"embeddings.word_embeddings.weight": E}, str(path / "model.safetensors"))
    return E


def _sparse(path, size=10 << 30, head=b""):
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)  # 10 GB of holes: no disk used, no newline
    return path


def test_a_10_gb_vocab_txt_is_refused_without_reading_it_whole(tmp_path):
    _hf_folder(tmp_path / "model")
    _sparse(tmp_path / "model" / "vocab.txt", head=b"[PAD]\nhello\n")
    res = run_cli_subprocess(["import", tmp_path / "model", tmp_path / "t.emb", "--quiet"],
                             address_space=1 << 30)
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr.strip() == (f"Error: {tmp_path / 'model' / 'vocab.txt'}, line 3: "
                                  "expected a token a line, got a line of more than 65536 bytes")


def test_a_vocab_txt_is_read_only_as_far_as_the_rows(tmp_path):
    E = _hf_folder(tmp_path / "model", rows=3)
    lines = ["[PAD]", "hello", "wörld"] + [f"extra{i}" for i in range(50000)]
    (tmp_path / "model" / "vocab.txt").write_text("\ufeff" + "\r\n".join(lines) + "\r\n")
    result = embstore.import_file(tmp_path / "model", tmp_path / "t.emb")
    with embstore.open(tmp_path / "t.emb") as t:
        assert list(t.keys) == ["[PAD]", "hello", "wörld"]
        np.testing.assert_array_equal(t[[0, 1, 2]], E)
    assert any("50000 token(s) of vocab.txt have ids past the table's 3 rows" in n
               for n in result.notes), result.notes


def test_a_10_gb_vocab_option_file_is_refused_without_reading_it_whole(tmp_path):
    np.save(tmp_path / "v.npy", np.ones((3, 4), np.float32))
    _sparse(tmp_path / "keys.txt", head=b"a\nb\n")
    res = run_cli_subprocess(["import", tmp_path / "v.npy", tmp_path / "t.emb", "--vocab",
                              tmp_path / "keys.txt", "--quiet"], address_space=1 << 30)
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr.strip() == (f"Error: {tmp_path / 'keys.txt'}, line 3: expected a key a "
                                  "line, got a line of more than 65536 bytes")


# -- remote metadata: bounded like local metadata ----------------------------------------
REMOTE_HUGE_META = r"""
import json, os, sys, numpy as np, embstore
from benchmarks import s3server
from click.testing import CliRunner
from embstore.cli import cli
srv = s3server.start()
os.environ.update(srv.env())
srv.make_bucket("meta-bucket")
embstore.save("s3://meta-bucket/t.emb", np.ones((4, 3), np.float32)).close()
c = srv.client()
doc = json.loads(c.get_object(Bucket="meta-bucket", Key="t.emb/zarr.json")["Body"].read())
doc["attributes"]["padding"] = "x" * (17 << 20)  # 17 MiB: over the 16 MiB local bound
c.put_object(Bucket="meta-bucket", Key="t.emb/zarr.json", Body=json.dumps(doc).encode())
srv.reset()
res = CliRunner().invoke(cli, ["info", "s3://meta-bucket/t.emb"])
print(json.dumps({"code": res.exit_code, "output": res.output,
                  "requests": dict(srv.requests)}))
"""


@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_a_huge_zarr_json_on_s3_is_refused_like_a_local_one():
    pytest.importorskip("moto")
    pytest.importorskip("obstore")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", REMOTE_HUGE_META], capture_output=True,
                         text=True, timeout=180, env=env, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["code"] == 1, got
    assert got["output"].startswith("Error: s3://meta-bucket/t.emb/zarr.json: ") and \
        "bytes, more than the 16777216 a metadata file may have" in got["output"], got
    assert got["output"].count("\n") == 1


# -- Parquet lists: bounded batches, a row too large refused -----------------------------
def _list_parquet(path, lists):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    lens = np.array([len(v) for v in lists])
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    values = np.concatenate([np.asarray(v, np.int32) for v in lists])
    col = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"ids": col}), path)
    return path


def test_one_parquet_row_of_40m_ids_is_refused_naming_the_limit(tmp_path):
    embstore.save(tmp_path / "t.emb", np.ones((10, 16), np.float32)).close()
    src = _list_parquet(tmp_path / "in.parquet",
                        [[1, 2], np.zeros(40_000_000, np.int32), [3]])
    res = run_cli_subprocess(["lookup", tmp_path / "t.emb", src, tmp_path / "out.parquet",
                              "--column", "ids", "--quiet"], address_space=2 << 30,
                             timeout=300)  # 2.56 GB of vectors were allocated at once
    assert res.returncode == 1, res.stderr[-2000:]
    assert res.stderr.strip() == (
        f"Error: {src}, row 1: a list of 40000000 ids in column 'ids', 2560000000 bytes of "
        "vectors: more than the 1073741824 one batch of rows may hold (a Parquet row is "
        "written whole: split the list)")
    assert not (tmp_path / "out.parquet").exists()


def test_parquet_batches_over_the_bound_are_split_and_equal_numpy(tmp_path, monkeypatch):
    pq = pytest.importorskip("pyarrow.parquet")
    from embstore.batch import arrowio

    monkeypatch.setattr(arrowio, "MAX_BATCH_BYTES", 5 * 16 * 4)  # 5 vectors of dim 16
    E = np.random.default_rng(2).normal(size=(10, 16)).astype(np.float32)
    embstore.save(tmp_path / "t.emb", E).close()
    lists = [[1, 2], [0, 9, 9, 4, 5], [], [3], [7, 7, 7], [8, 1, 0, 2]]
    src = _list_parquet(tmp_path / "in.parquet", lists)
    embstore.lookup_file(tmp_path / "t.emb", src, tmp_path / "out.parquet", column="ids")
    got = pq.read_table(tmp_path / "out.parquet").column("vector").to_pylist()
    assert len(got) == len(lists)
    for row, ids in zip(got, lists):
        np.testing.assert_array_equal(np.asarray(row, np.float32).reshape(-1, 16), E[ids])
    with pytest.raises(embstore.ResultTooLargeError, match=r"row 3: a list of 6 ids"):
        embstore.lookup_file(tmp_path / "t.emb",
                             _list_parquet(tmp_path / "in2.parquet", [[1], [2], [3], [0] * 6]),
                             tmp_path / "out2.parquet", column="ids")


# -- Embedding.bag: one bag of 1e7 ids in bounded blocks ---------------------------------
BIG_BAG = r"""
import resource, sys, json, numpy as np
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
import embstore
with embstore.open(sys.argv[1]) as t:
    emb = embstore.Embedding(t)
    ids = np.arange(10_000_000, dtype=np.int64) % 100
    got = emb.bag(ids, offsets=[0, 5], mode=sys.argv[2])
print(json.dumps(got.tolist()))
"""


@pytest.mark.parametrize("mode", ["mean", "max"])
@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_a_bag_of_1e7_ids_is_pooled_in_bounded_blocks(tmp_path, mode):
    """1e7 ids x dim 64: 2.56 GB of rows gathered at once before (MemoryError under a
    1.5 GiB address space); now in blocks of 64 MiB."""
    E = np.random.default_rng(4).normal(size=(100, 64)).astype(np.float32)
    embstore.save(tmp_path / "t.emb", E).close()
    out = subprocess.run([sys.executable, "-c", BIG_BAG, str(tmp_path / "t.emb"), mode],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    got = np.array(json.loads(out.stdout))
    ids = np.arange(10_000_000) % 100
    if mode == "mean":
        counts = np.bincount(ids[5:], minlength=100)  # (never 1e7 x 64 rows in this process)
        want = np.stack([E[ids[:5]].astype(np.float64).mean(0),
                         counts @ E.astype(np.float64) / counts.sum()])
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, np.stack([E[:5].max(0), E.max(0)]))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_bags_in_blocks_equal_torch(monkeypatch, mode, weighted):
    torch = pytest.importorskip("torch")
    from embstore import pooling

    if weighted and mode != "sum":
        pytest.skip("torch weighs bags in mode 'sum' only")
    monkeypatch.setattr(pooling, "BAG_BLOCK_BYTES", 7 * 8 * 4)  # 7 rows of dim 8 per block
    rng = np.random.default_rng(8)
    E = rng.normal(size=(30, 8)).astype(np.float32)
    emb = embstore.Embedding(embstore.MemoryTable(E), padding_idx=3)
    ids = rng.integers(0, 30, 61)
    ids[[4, 5, 20]] = 3
    offsets = np.array([0, 0, 2, 19, 20, 21, 45, 60])
    w = rng.random(61).astype(np.float32) if weighted else None
    ref = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(E), mode=mode,
                                                padding_idx=3)
    want = ref(torch.from_numpy(ids), torch.from_numpy(offsets),
               per_sample_weights=None if w is None else torch.from_numpy(w)).numpy()
    np.testing.assert_allclose(emb.bag(ids, offsets, weights=w, mode=mode), want,
                               rtol=1e-5, atol=1e-6)
    fixed = ids[:60].reshape(6, 10)  # 2-D bags past the block: pooled the same way
    want2 = ref(torch.from_numpy(fixed), per_sample_weights=None if w is None else
                torch.from_numpy(w[:60].reshape(6, 10))).numpy()
    np.testing.assert_allclose(emb.bag(fixed, weights=None if w is None else
                                       w[:60].reshape(6, 10), mode=mode), want2,
                               rtol=1e-5, atol=1e-6)


# -- results larger than RLIMIT_AS: ResultTooLargeError, not NumPy's MemoryError ----------
RESULT_UNDER_LIMIT = r"""
import resource, sys, numpy as np
resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))
import embstore
with embstore.open(sys.argv[1]) as t:
    try:
        t.lookup(np.zeros(int(sys.argv[2]), np.int64))
    except Exception as exc:
        print(type(exc).__name__, isinstance(exc, MemoryError), exc)
"""


@pytest.mark.parametrize("n,message", [
    (2_000_000, r"ResultTooLargeError True 2000000 ids of 1024-byte rows make a 2048000000-byte "
                r"result, more than the process's address space limit \(RLIMIT_AS\) of "
                r"1610612736 bytes of memory"),
    (1_400_000, r"ResultTooLargeError True a result of shape \(1400000, 256\) \(1433600000 "
                r"bytes\) cannot be allocated: the system refused the memory"),
], ids=["over-the-limit", "under-the-limit-but-refused"])
def test_a_result_past_rlimit_as_is_result_too_large(tmp_path, n, message):
    embstore.save(tmp_path / "t.emb", np.ones((100, 256), np.float32)).close()
    out = subprocess.run([sys.executable, "-c", RESULT_UNDER_LIMIT, str(tmp_path / "t.emb"),
                          str(n)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert re.match(message, out.stdout), out.stdout
