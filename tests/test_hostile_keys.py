"""Hostile keys and text: collision floods, huge keys, the legacy hash, tokenisation, BOMs,
CR-only line ends and files ending in megabytes of blank lines."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
import embstore.keys.hashing as hashing
import embstore.keys.writer as key_writer
from embstore.cli import cli
from embstore.errors import FormatError
from embstore.keys.hashing import MAX_KEY_BYTES, encode_keys, hash_keys

M64 = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & M64


def siphash13_ref(data: bytes, k0: int, k1: int) -> int:
    """SipHash-1-3 with Python ints, from the reference description (independent)."""
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D,
         k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def rnd():
        v[0] = (v[0] + v[1]) & M64; v[1] = _rotl(v[1], 13) ^ v[0]; v[0] = _rotl(v[0], 32)  # noqa: E702
        v[2] = (v[2] + v[3]) & M64; v[3] = _rotl(v[3], 16) ^ v[2]  # noqa: E702
        v[0] = (v[0] + v[3]) & M64; v[3] = _rotl(v[3], 21) ^ v[0]  # noqa: E702
        v[2] = (v[2] + v[1]) & M64; v[1] = _rotl(v[1], 17) ^ v[2]; v[2] = _rotl(v[2], 32)  # noqa: E702

    end = len(data) - len(data) % 8
    for i in range(0, end, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v[3] ^= m
        rnd()
        v[0] ^= m
    b = ((len(data) & 0xFF) << 56) | int.from_bytes(data[end:], "little")
    v[3] ^= b
    rnd()
    v[0] ^= b
    v[2] ^= 0xFF
    for _ in range(3):
        rnd()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


SAMPLE = ["", "a", "abcdefg", "abcdefgh", "abcdefghi", "\x00", "é" * 9, "日本語のキー",
          "a much longer key spanning several eight-byte words, 0123456789"]


def test_siphash_matches_the_reference_and_pythons_own():
    key = (0x0706050403020100, 0x0F0E0D0C0B0A0908)
    got = hash_keys(SAMPLE, key=key)
    assert [int(x) for x in got] == [siphash13_ref(s.encode(), *key) for s in SAMPLE]
    np.testing.assert_array_equal(hash_keys(SAMPLE[::-1], key=key)[::-1], got)
    # CPython's bytes hash is SipHash-1-3 with a zero key when PYTHONHASHSEED=0
    out = subprocess.run([sys.executable, "-c", f"print([hash(s.encode()) & {M64} for s in "
                          f"{SAMPLE[1:]!r}])"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"}).stdout
    assert out.strip() == str([int(x) for x in hash_keys(SAMPLE[1:], key=(0, 0))])


def emb64_collisions(n: int) -> list[str]:
    """``n`` distinct 16-byte ASCII keys with one ``emb64-v1`` hash (it is invertible)."""
    P1, P2, P3 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
    inv1, inv2 = pow(P1, -1, 1 << 64), pow(P2, -1, 1 << 64)
    rng = np.random.default_rng(5)
    h0 = np.uint64(0x2545F4914F6CDD1D ^ ((16 * P3) & M64))
    target = np.uint64(0x0123456789ABCDEF)  # the state after the second word
    found: list[str] = []
    with np.errstate(over="ignore"):
        while len(found) < n:
            w1 = rng.integers(0x21, 0x7F, (1 << 20, 8), dtype=np.uint8).view("<u8").ravel()
            x = (h0 ^ (w1 * np.uint64(P2)))
            s1 = ((x << np.uint64(31)) | (x >> np.uint64(33))) * np.uint64(P1)
            y = target * np.uint64(inv1)
            y = (y >> np.uint64(31)) | (y << np.uint64(33))  # rotr 31
            w2 = (y ^ s1) * np.uint64(inv2)
            b2 = w2.view(np.uint8).reshape(-1, 8)
            ok = ((b2 > 0x20) & (b2 < 0x7F)).all(axis=1)
            for a, b in zip(w1[ok].view(np.uint8).reshape(-1, 8), b2[ok]):
                found.append((a.tobytes() + b.tobytes()).decode("ascii"))
    return found[:n]


def test_a_collision_flood_makes_no_long_runs(tmp_path, monkeypatch):
    keys = emb64_collisions(3000)
    assert len(set(keys)) == 3000 and len(set(hash_keys(keys).tolist())) == 1  # emb64-v1
    path = tmp_path / "t"
    E = np.arange(3000 * 2, dtype=np.float32).reshape(3000, 2)
    embstore.save(path, E, keys=keys).close()
    with embstore.open(path) as t:
        stored = t._vocab()._hash.read(0, 3000)
        assert len(np.unique(stored)) == 3000  # no run of equal hashes to walk
        calls = []
        real = hashing.keys_equal
        monkeypatch.setattr(hashing, "keys_equal", lambda *a: calls.append(1) or real(*a))
        ids = t.ids_of(keys[::-1])
        assert ids.tolist() == list(range(2999, -1, -1))
        assert len(calls) <= 2  # one pass (the old hash: one pass per key of the run)
        np.testing.assert_array_equal(t.lookup_keys(keys[:5]), E[:5])


def test_each_table_has_its_own_hash_key(tmp_path):
    for name in ("a", "b"):
        embstore.save(tmp_path / name, np.zeros((3, 2), np.float32), keys=["x", "y", "z"]).close()
    import zarr
    infos = [zarr.open_array(tmp_path / n / "key_hash").attrs["embstore_key_index"]
             for n in ("a", "b")]
    assert infos[0]["hash"] == infos[1]["hash"] == "siphash-1-3"
    assert infos[0]["key"] != infos[1]["key"] and len(infos[0]["key"]) == 32
    for n, info in zip(("a", "b"), infos):
        k = (int(info["key"][:16], 16), int(info["key"][16:], 16))
        stored = zarr.open_array(tmp_path / n / "key_hash")[:]
        assert sorted(stored.tolist()) == sorted(siphash13_ref(s.encode(), *k) for s in "xyz")


def test_legacy_emb64_tables_stay_readable_and_appendable(tmp_path, monkeypatch):
    monkeypatch.setattr(key_writer, "new_hash_key", lambda: None)  # write as before
    E = np.arange(40, dtype=np.float32).reshape(20, 2)
    keys = [f"w{i}" for i in range(20)]
    embstore.save(tmp_path / "old", E, keys=keys).close()
    monkeypatch.undo()
    import zarr
    attrs = zarr.open_array(tmp_path / "old" / "key_hash").attrs["embstore_key_index"]
    assert attrs == {"version": 1, "hash": "emb64-v1"}
    with embstore.open(tmp_path / "old", mode="r+") as t:
        assert t.ids_of(keys[::-1]).tolist() == list(range(19, -1, -1))
        t.append(np.ones((2, 2), np.float32), keys=["new1", "new2"])
        assert t.ids_of(["new2", "w3"]).tolist() == [21, 3]
    assert embstore.verify(tmp_path / "old").ok
    attrs = zarr.open_array(tmp_path / "old" / "key_hash").attrs["embstore_key_index"]
    assert attrs["hash"] == "siphash-1-3"  # an append re-keys the legacy hash (issue 31)


def test_key_length_is_bounded(tmp_path, monkeypatch):
    E = np.zeros((2, 2), np.float32)
    with pytest.raises(FormatError, match=f"more than the {MAX_KEY_BYTES}"):
        embstore.save(tmp_path / "t", E, keys=["a", "x" * (MAX_KEY_BYTES + 1)])
    embstore.save(tmp_path / "t", E, keys=["a", "b" * MAX_KEY_BYTES]).close()
    seen = []
    real = hashing.siphash13
    monkeypatch.setattr(hashing, "siphash13",
                        lambda enc, key: seen.append(int(enc.lengths.max())) or real(enc, key))
    with embstore.open(tmp_path / "t") as t:
        huge = "y" * (2 << 20)  # took 8 s per lookup
        assert t.ids_of(["a", huge, "b" * MAX_KEY_BYTES], missing=-1).tolist() == [0, -1, 1]
        with pytest.raises(embstore.KeyNotFoundError):
            t.ids_of([huge])
    assert max(seen) <= MAX_KEY_BYTES


# -- text -----------------------------------------------------------------------------------
def _import(tmp_path, content: bytes, fmt: str):
    src = tmp_path / "src.txt"
    src.write_bytes(content)
    embstore.import_file(src, tmp_path / "t", format=fmt, overwrite=True)
    return embstore.open(tmp_path / "t")


def test_a_file_ending_in_blank_lines_imports_in_bounded_memory(tmp_path):
    src = tmp_path / "blank.txt"
    with open(src, "wb") as f:
        f.write(b"a 1 2\nb 3 4\nc 5 6\n")
        f.write(b"\n" * (24 << 20))
        f.write(b" \r\n\t\n")
    tracemalloc.start()
    try:
        embstore.import_file(src, tmp_path / "t", format="glove")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 96 << 20, peak  # the old carry-over took 100x the blank bytes
    with embstore.open(tmp_path / "t") as t:
        np.testing.assert_array_equal(t.to_numpy(), [[1, 2], [3, 4], [5, 6]])
        assert list(t.keys) == ["a", "b", "c"]


@pytest.mark.parametrize("block", [4, 7, 64])
def test_blank_lines_before_more_rows_name_the_first_blank_line(tmp_path, block):
    from embstore.formats.word2vec import TextReader

    src = tmp_path / "g.txt"
    src.write_bytes(b"a 1 2\nb 3 4\n\n \nc 5 6\n")
    r = TextReader(src, header=False, format="glove", block_bytes=block)
    with pytest.raises(FormatError, match="line 3: .*empty line"):
        list(r.blocks())
    r.close()


@pytest.mark.parametrize("fmt,content", [
    ("glove", b"\xef\xbb\xbfthe 1 2\nof 3 4\n"),
    ("word2vec", b"\xef\xbb\xbf2 2\nthe 1 2\nof 3 4\n"),
])
def test_a_utf8_bom_is_not_part_of_the_first_key(tmp_path, fmt, content):
    with _import(tmp_path, content, fmt) as t:
        assert list(t.keys) == ["the", "of"]
        assert t.ids_of(["the"]).tolist() == [0]


def test_a_bom_in_a_vocab_file_and_a_keys_file(tmp_path):
    np.save(tmp_path / "e.npy", np.arange(4, dtype=np.float32).reshape(2, 2))
    (tmp_path / "vocab.txt").write_bytes(b"\xef\xbb\xbfthe\r\nof\r\n")
    embstore.import_file(tmp_path / "e.npy", tmp_path / "t", vocab=tmp_path / "vocab.txt")
    with embstore.open(tmp_path / "t") as t:
        assert list(t.keys) == ["the", "of"]
    (tmp_path / "q.txt").write_bytes(b"\xef\xbb\xbfthe of\nof\n")
    res = CliRunner().invoke(cli, ["lookup", str(tmp_path / "t"), str(tmp_path / "q.txt"),
                                   str(tmp_path / "o.npy"), "--keys", "-q"])
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"),
                                  [[[0, 1], [2, 3]], [[2, 3], [0, 0]]])


@pytest.mark.parametrize("fmt,content", [
    ("glove", b"the 1 2\rof 3 4\r"),
    ("word2vec", b"2 2\rthe 1 2\rof 3 4\r"),
    ("glove", b"the 1 2\nof 3 4\rx 5 6\n"),
])
def test_cr_only_line_ends_are_an_error(tmp_path, fmt, content):
    with pytest.raises(FormatError, match="carriage return"):
        _import(tmp_path, content, fmt)


def test_cr_only_keys_files_are_an_error(tmp_path):
    embstore.save(tmp_path / "t", np.zeros((2, 2), np.float32), keys=["a", "b"]).close()
    (tmp_path / "q.txt").write_bytes(b"a b\rb a\r")
    res = CliRunner().invoke(cli, ["lookup", str(tmp_path / "t"), str(tmp_path / "q.txt"),
                                   str(tmp_path / "o.npy"), "--keys"])
    assert res.exit_code == 1 and "carriage return" in res.output, res.output
    np.save(tmp_path / "e.npy", np.zeros((2, 2), np.float32))
    (tmp_path / "v.txt").write_bytes(b"a\rb\r")
    with pytest.raises(FormatError, match="carriage return"):
        embstore.import_file(tmp_path / "e.npy", tmp_path / "u", vocab=tmp_path / "v.txt")


def test_keys_with_unicode_spaces_come_back_from_lookup_keys(tmp_path):
    src = "a\u00a0b 1 2\nx\u3000y 3 4\nz\x1cw 5 6\nplain 7 8\n".encode()
    with _import(tmp_path, src, "glove") as t:
        assert list(t.keys) == ["a\u00a0b", "x\u3000y", "z\x1cw", "plain"]
    (tmp_path / "q.txt").write_text("x\u3000y a\u00a0b\nplain\tz\x1cw\n", encoding="utf-8")
    res = CliRunner().invoke(cli, ["lookup", str(tmp_path / "t"), str(tmp_path / "q.txt"),
                                   str(tmp_path / "o.npy"), "--keys", "-q"])
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"),
                                  [[[3, 4], [1, 2]], [[7, 8], [5, 6]]])
    assert encode_keys(["a\u00a0b"]).lengths.tolist() == [4]
