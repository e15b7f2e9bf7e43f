"""Tables written by zarr-python directly: with and without checksums, sharded or not, with a
plain ``keys`` string array and no key index; and a checksummed key index that lies."""

from __future__ import annotations

import json
import logging
import re

import itertools

import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from contract import TableContract, WrittenOnce, copy_tree
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

import embstore
from embstore import Embedding
from embstore.cli import cli

V, D = 120, 6
KEYS = [f"w{i}" for i in range(V)]

LAYOUTS = {  # name -> (create_array keywords, vectors carry a checksum)
    "plain": (dict(chunks=(16, D)), False),
    "sharded": (dict(chunks=(8, D), shards=(32, D)), False),
    "crc": (dict(chunks=(16, D), serializer=BytesCodec(), compressors=[Crc32cCodec()]), True),
    "crc-sharded": (dict(chunks=(8, D), shards=(32, D), compressors=[Crc32cCodec()]), True),
    "crc-zstd-sharded": (dict(chunks=(8, D), shards=(64, D),
                              compressors=[ZstdCodec(level=1), Crc32cCodec()]), True),
}


@pytest.fixture
def E(rng):
    return rng.standard_normal((V, D)).astype(np.float32)


def write_foreign(path, E, layout, *, keys=None, keys_crc=False):
    kw, _ = LAYOUTS[layout]
    g = zarr.open_group(str(path), mode="w")
    g.create_array("vectors", shape=E.shape, dtype=E.dtype, **kw)[:] = E
    if keys is not None:
        extra = dict(compressors=[ZstdCodec(level=1), Crc32cCodec()]) if keys_crc else {}
        g.create_array("keys", shape=(len(keys),), dtype=str, chunks=(50,), **extra)[:] = \
            np.array(keys)
    return path


def brute_similar(E, i, k):
    n = E / np.linalg.norm(E, axis=1, keepdims=True)
    s = n @ n[i]
    s[i] = -np.inf
    return np.lexsort((np.arange(len(s)), -s))[:k]



class ForeignTables(TableContract):
    """The Table contract on tables whose arrays zarr-python wrote (``layout``: a name of
    LAYOUTS), opened by embstore with the mode asked."""

    layout = "plain"

    @pytest.fixture(scope="class")
    @classmethod
    def written_once(cls, tmp_path_factory) -> WrittenOnce:
        """Each distinct table written once per class (a read-only open writes nothing;
        a writable one opens a copy)."""
        home = tmp_path_factory.mktemp("foreign")
        names = itertools.count()
        return WrittenOnce(lambda dest, array, keys: write_foreign(dest, array, cls.layout,
                                                                  keys=keys),
                           lambda: home / f"t{next(names)}", copy_tree)

    @pytest.fixture
    def make_table(self, tmp_path, written_once):
        names = itertools.count()
        opened = []

        def make(array, keys=None, mode="r+"):
            path = written_once.place(array, keys, mode, lambda: tmp_path / f"t{next(names)}")
            opened.append(embstore.open(path, mode=mode, cache_bytes="1MiB"))
            return opened[-1]

        yield make
        for t in opened:
            t.close()


class ForeignShardedTables(ForeignTables):
    """Sharded layouts written by zarr-python.  The contract found that writing two rows of
    one inner chunk failed there (zarr-python 3.1.6's orthogonal selection on a sharded
    array, issue #2834, raised a bare ValueError); embstore now writes each touched inner
    chunk as one slice, and the whole contract runs."""


class TestForeignPlain(ForeignTables):
    layout = "plain"


class TestForeignSharded(ForeignShardedTables):
    layout = "sharded"


class TestForeignCrc(ForeignTables):
    layout = "crc"


class TestForeignCrcSharded(ForeignShardedTables):
    layout = "crc-sharded"


class TestForeignCrcZstdSharded(ForeignShardedTables):
    layout = "crc-zstd-sharded"

@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_foreign_table_reads_and_key_lookups(tmp_path, E, layout, caplog):
    path = write_foreign(tmp_path / "t", E, layout, keys=KEYS)
    with caplog.at_level(logging.WARNING, logger="embstore"), embstore.open(path) as t:
        assert t.shape == (V, D)
        np.testing.assert_array_equal(t[[0, 5, V - 1]], E[[0, 5, V - 1]])
        np.testing.assert_array_equal(t.to_numpy(), E)
        assert list(t.keys) == KEYS and t.keys[7] == "w7"
        np.testing.assert_array_equal(t.ids_of([["w3", "w99"]]), [[3, 99]])
        np.testing.assert_array_equal(t.ids_of(["nope"], missing=-1), [-1])
        got = t.lookup_keys(["w11", "nope"], oov="zero")
        np.testing.assert_array_equal(got, np.stack([E[11], np.zeros(D, np.float32)]))
        assert "w42" in t and "nope" not in t
        ids, _ = Embedding(t).most_similar("w17", k=5)
        np.testing.assert_array_equal(ids, brute_similar(E.astype(np.float64), 17, 5))
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "keys without a key index: indexed 120 keys in memory" \
        in notices[0]
    assert not (path / "key_hash").exists()  # a read-only open writes nothing


def test_foreign_duplicate_keys_first_row_wins(tmp_path, E):
    keys = KEYS.copy()
    keys[50] = "w3"
    path = write_foreign(tmp_path / "t", E, "crc", keys=keys)
    with embstore.open(path) as t:
        assert t.ids_of("w3") == 3 and t.keys[50] == "w3"
    with embstore.open(path, mode="r+") as t:
        assert t.ids_of("w3") == 3


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_verify_does_not_vouch_for_unchecksummed_chunks(tmp_path, E, layout):
    path = write_foreign(tmp_path / "t", E, layout, keys=KEYS, keys_crc=True)
    report = embstore.verify(path)
    vectors_crc = LAYOUTS[layout][1]
    assert report.damaged == []
    if vectors_crc:
        assert report.ok and report.checksummed and report.unchecked == 0
        assert str(report).startswith("OK ") and "no damage" in str(report)
        assert report.chunks == V // 8 + (V % 8 > 0) if "sharded" in layout else V // 16 + 1
    else:
        assert not report.ok and not report and not report.checksummed
        assert report.unchecked > 0 and report.chunks == 0
        assert "no damage" not in str(report)
        assert str(report).startswith("UNVERIFIED ") and \
            (f"{report.unchecked} chunks of vectors carry no checksum" if report.unchecked > 1
             else "1 chunk of vectors carries no checksum") in str(report)
    res = CliRunner().invoke(cli, ["verify", str(path)])
    assert res.exit_code == (0 if vectors_crc else 1), res.output
    if not vectors_crc:
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"Error: {path} cannot be verified: ")
    info = json.loads(CliRunner().invoke(cli, ["info", str(path), "--json"]).stdout)
    assert info["checksummed"] is vectors_crc


def test_unchecksummed_keys_are_noted(tmp_path, E):
    """Checked rows with a foreign keys array without crc32c: OK, and the keys are named."""
    path = write_foreign(tmp_path / "t", E, "crc-sharded", keys=KEYS)  # keys without crc32c
    report = embstore.verify(path)
    assert report.ok and report.checksummed and report.unchecked_arrays == ["keys"]
    assert str(report).endswith("no damage; array keys carries no checksum (written without "
                                "the crc32c codec): read, but they cannot be verified")
    res = CliRunner().invoke(cli, ["verify", str(path)])
    assert res.exit_code == 0
    res = CliRunner().invoke(cli, ["info", str(path)])
    assert re.search(r"checksummed: +yes; not checksummed: keys\n", res.output)
    info = json.loads(CliRunner().invoke(cli, ["info", str(path), "--json"]).stdout)
    assert info["checksummed"] is True and info["unchecksummed_arrays"] == ["keys"]
    path = write_foreign(tmp_path / "u", E, "plain", keys=KEYS)
    info = json.loads(CliRunner().invoke(cli, ["info", str(path), "--json"]).stdout)
    assert info["checksummed"] is False and info["unchecksummed_arrays"] == ["keys", "vectors"]
    assert re.search(r"checksummed: +no \(vectors written without crc32c",
                     CliRunner().invoke(cli, ["info", str(path)]).output)


def test_embstore_tables_are_checksummed(tmp_path, E):
    embstore.save(tmp_path / "t", E, keys=KEYS).close()
    report = embstore.verify(tmp_path / "t")
    assert report.ok and report.checksummed
    assert {"keys", "key_hash", "key_order", "key_offsets", "key_utf8"} <= set(report.arrays)
    info = json.loads(CliRunner().invoke(cli, ["info", str(tmp_path / "t"), "--json"]).stdout)
    assert info["checksummed"] is True and info["unchecksummed_arrays"] == []


def test_read_write_open_stores_the_key_index(tmp_path, E):
    path = write_foreign(tmp_path / "t", E, "crc-sharded", keys=KEYS, keys_crc=True)
    embstore.open(path, mode="r+").close()  # opening for writing stores the index
    assert (path / "key_hash" / "zarr.json").is_file()
    with embstore.open(path) as t:
        assert t.ids_of("w9") == 9 and type(t._vocab()).__name__ == "DiskVocab"
    report = embstore.verify(path)
    assert report.ok and "key_hash" in report.arrays  # the deep check ran on it
    with embstore.open(path, mode="r+") as t:  # appends go through the stored index
        new = t.append(np.ones((2, D), np.float32), keys=["x", "y"])
        np.testing.assert_array_equal(new, [V, V + 1])
    with embstore.open(path) as t:
        np.testing.assert_array_equal(t.ids_of(["y", "w0"]), [V + 1, 0])


def test_reindex_command(tmp_path, E):
    path = write_foreign(tmp_path / "t", E, "crc", keys=KEYS, keys_crc=True)
    res = CliRunner().invoke(cli, ["reindex", str(path)])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"indexed {V} keys of {path}"
    with embstore.open(path) as t:
        assert t.ids_of("w77") == 77
    embstore.save(tmp_path / "nokeys", E).close()
    res = CliRunner().invoke(cli, ["reindex", str(tmp_path / "nokeys")])
    assert res.exit_code == 1 and "has no keys array" in res.output


# -- a checksummed key index that lies: only the deep check sees it ---------------------------
def _rewrite(path, name, fn):
    arr = zarr.open_array(str(path / name), mode="r+")  # same codecs: valid checksums
    arr[:] = fn(arr[:])
    _repin(path / name)


def _repin(array):
    """A hostile writer's re-pin: each chunk's crc32c recorded in the array's zarr.json
    (keys/mapped.py checks them first), so the damage reaches the deeper checks."""
    meta_path = array / "zarr.json"
    meta = json.loads(meta_path.read_text())
    pins = meta.get("attributes", {}).get("embstore_chunk_crc32c")
    if pins is not None:
        meta["attributes"]["embstore_chunk_crc32c"] = [
            int.from_bytes((array / "c" / str(i)).read_bytes()[-4:], "little")
            for i in range(len(pins))]
        meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize("damage, message", [
    ("unsorted", "key_hash is not sorted"),
    ("order-swapped", "key_hash disagrees with the keys"),
    ("order-dup", "key_order is not a permutation"),
    ("keys-changed", "'keys' disagrees with key_utf8"),
    ("offsets", "key_offsets are not increasing"),
])
def test_verify_runs_the_deep_key_index_check(tmp_path, E, damage, message):
    path = tmp_path / "t"
    # (format 1: no version pins its files, so damage written with valid checksums and
    # re-pinned chunks reaches the deep check; a versioned table's pins find it first)
    embstore.save(path, E, keys=KEYS, format_version=1).close()
    assert embstore.verify(path).ok
    if damage == "unsorted":
        _rewrite(path, "key_hash", lambda h: h[::-1].copy())
    elif damage == "order-swapped":
        _rewrite(path, "key_order", lambda o: np.concatenate([o[1:2], o[:1], o[2:]]))
    elif damage == "order-dup":
        _rewrite(path, "key_order", lambda o: np.concatenate([o[:1], o[:-1]]))
    elif damage == "keys-changed":
        _rewrite(path, "keys", lambda k: np.where(np.arange(V) == 5, "zzz", k.astype(object)))
    else:
        _rewrite(path, "key_offsets", lambda o: np.where(np.arange(V + 1) == 4, o[6], o))
    report = embstore.verify(path)
    assert not report.ok and report.checksummed
    assert any(message in d.message for d in report.damaged), str(report)
    res = CliRunner().invoke(cli, ["verify", str(path)])
    assert res.exit_code == 1 and message in res.output
    if damage != "keys-changed":  # reindex rebuilds the index from the keys array
        assert CliRunner().invoke(cli, ["reindex", str(path)]).exit_code == 0
        assert embstore.verify(path).ok
        with embstore.open(path) as t:
            np.testing.assert_array_equal(t.ids_of(KEYS), np.arange(V))


def test_deep_check_streams_in_blocks(tmp_path, E):
    """The check works block by block (blocks smaller than the table find the same damage)."""
    from embstore.keys.index import DiskVocab

    path = tmp_path / "t"
    embstore.save(path, E, keys=KEYS).close()
    vocab = DiskVocab.open(None, path)
    vocab.verify(block=7)
    vocab.close()
    _rewrite(path, "key_hash", lambda h: np.concatenate([h[:60], h[61:62], h[60:61], h[62:]]))
    vocab = DiskVocab.open(None, path)
    with pytest.raises(embstore.CorruptStoreError, match="key_hash is not sorted"):
        vocab.verify(block=7)
    vocab.close()
