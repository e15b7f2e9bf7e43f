"""Merged deltas on object storage (docs/FORMAT.md §11a, *Merged deltas*): a commit replaces
its parent's newest row deltas by one merge, so a version's manifest does not grow with
commits; rebases and compactions that meet a merge keep every row of every version (checked
against a NumPy replay of the commits)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import embstore
from embstore.dtypes import DTYPES
from embstore.store.objects import merging
from embstore.store.objects.compact import compact_objects
from embstore.keys.hashing import hash_encoded
from embstore.store.objects.manifest import AREA, encode, key_delta_bytes, manifest_name
from s3faults import s3, s3_server  # noqa: F401

BUDGET = merging.MERGE_BYTES

pytest.importorskip("moto")
pytest.importorskip("obstore")


def _table(s3, rng, rows=300, dim=8, **layout):
    url = f"s3://{s3.bucket}/m.emb"
    E = rng.standard_normal((rows, dim)).astype(np.float32)
    embstore.save(url, E, **layout).close()
    return url, E


def _manifest(s3, n: int) -> dict:
    raw = s3.client().get_object(Bucket=s3.bucket, Key=f"m.emb/{manifest_name(n)}")["Body"]
    return json.loads(raw.read())


def _data(s3) -> dict[str, int]:
    res = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=f"m.emb/{AREA}data/")
    return {o["Key"]: o["Size"] for o in res.get("Contents", [])}


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_many_small_commits_keep_two_deltas_and_every_version_reads_exactly(s3, rng, dtype):
    """30 commits (writes, appends, rows written again): each version's manifest lists at
    most two commits' row deltas (a merge and the commit's own), each commit uploads its own
    delta and at most MERGE_BYTES more, and every version reads as the replay."""
    url, E = _table(s3, rng, dtype=dtype)
    rec = DTYPES[dtype]
    R, refs = rec.stored(E), {}
    with embstore.open(url, mode="r+", cache_bytes=0) as t:
        for c in range(30):
            before = _data(s3)
            if c % 5 == 4:
                new = rng.standard_normal((3, 8)).astype(np.float32)
                t.append(new)
                R = np.vstack([R, rec.stored(new)])
            else:
                ids = np.unique(rng.integers(0, len(R), size=6))
                vals = rng.standard_normal((ids.size, 8)).astype(np.float32)
                t.write(ids, vals)
                R[ids] = rec.stored(vals)
            refs[t.version] = R.copy()
            doc = _manifest(s3, t.version)
            vec = [e for e in doc["deltas"] if e["array"] == "vectors"]
            assert len(vec) == min(2, c + 1), (c, doc["deltas"])
            assert len(doc["deltas"]) == len(vec) * (2 if dtype == "int8" else 1)
            if c >= 2:  # from the third commit on: a merge of everything before
                assert vec[0]["kind"] == "merge" and doc["change"]["merged"] == 2
            new_objects = {k: n for k, n in _data(s3).items() if k not in before}
            own = sum(e["bytes"] for e in doc["deltas"] if e["kind"] != "merge")
            assert sum(new_objects.values()) <= own + merging.MERGE_BYTES
            np.testing.assert_array_equal(t.to_numpy(), R)
    for n, ref in refs.items():
        with embstore.open(url, version=n, cache_bytes=0) as r:
            np.testing.assert_array_equal(r.to_numpy(), ref)
    assert embstore.verify(url).ok


def _write(t, R, ids, value: float):
    ids = np.asarray(ids)
    t.write(ids, np.full((ids.size, R.shape[1]), value, np.float32))
    R[ids] = value


def test_a_merge_is_placed_on_a_winner_that_kept_what_it_merged(s3, rng, monkeypatch):
    """Two handles on version 2 (two deltas): the first commits without a merge (nothing
    fits its budget), the second merges both deltas, loses the race and rebases: its merge
    goes where those deltas were, before the winner's row 5, which the merge holds too."""
    url, E = _table(s3, rng)
    R = E.copy()
    with embstore.open(url, mode="r+") as a, embstore.open(url, mode="r+") as b:
        _write(a, R, [5, 6], 1.0)
        _write(a, R, [7], 2.0)
        b.refresh()
        monkeypatch.setattr(merging, "MERGE_BYTES", 0)  # (a's budget: its own 116 bytes)
        _write(a, R, [5], 3.0)  # version 3, on the deltas of 1 and 2: rows 5 and 6 of 1
        monkeypatch.setattr(merging, "MERGE_BYTES", BUDGET)
        _write(b, R, [8], 4.0)  # made on version 2 with a merge of 1 and 2; rebased on 3
        assert b.version == 4
        np.testing.assert_array_equal(b.to_numpy(), R)
    doc = _manifest(s3, 4)
    assert [e["kind"] for e in doc["deltas"]] == ["merge", "write", "write"]
    assert doc["deltas"][0]["merged"] == [e["object"] for e in _manifest(s3, 2)["deltas"]]
    assert doc["deltas"][1] == _manifest(s3, 3)["deltas"][-1]
    with embstore.open(url) as r:
        np.testing.assert_array_equal(r.to_numpy(), R)  # row 5 is 3.0: version 3's


def test_a_merge_is_left_out_when_the_winner_merged_the_same_deltas(s3, rng):
    url, E = _table(s3, rng)
    R = E.copy()
    with embstore.open(url, mode="r+") as a, embstore.open(url, mode="r+") as b:
        _write(a, R, [1], 1.0)
        _write(a, R, [2], 2.0)
        b.refresh()
        _write(a, R, [1, 3], 3.0)  # version 3: merges 1 and 2
        _write(b, R, [4], 4.0)  # its merge of 1 and 2 is moot: only its own delta
        np.testing.assert_array_equal(b.to_numpy(), R)
        assert b.version == 4
    three, four = _manifest(s3, 3), _manifest(s3, 4)
    assert four["deltas"][:-1] == three["deltas"] and four["deltas"][-1]["kind"] == "write"
    assert "merged" not in four["change"]
    keep = {f"m.emb/{e['object']}" for n in (3, 4) for e in _manifest(s3, n)["deltas"]}
    assert len(set(_data(s3)) - keep) >= 3  # (versions 1-2's and b's merge: vacuum's)
    with embstore.open(url, mode="r+") as t:
        t.vacuum(keep=2, cutoff=0)
    assert set(_data(s3)) == keep
    with embstore.open(url) as r:
        np.testing.assert_array_equal(r.to_numpy(), R)


def test_a_compaction_that_loses_to_a_merge_drops_it_and_keeps_the_winners_rows(
        s3, rng, monkeypatch):
    url, E = _table(s3, rng)
    R = E.copy()
    with embstore.open(url, mode="r+") as a, embstore.open(url, mode="r+") as c:
        _write(a, R, [1, 2], 1.0)
        _write(a, R, [2, 3], 2.0)
        c.refresh()
        _write(a, R, [2, 4], 3.0)  # version 3: a merge of 1-2 (folded by c) and its own
        v = c._v  # c compacts version 2, loses to 3 and rebases: the merge is dropped
        doc = compact_objects(v, c._versions.deltas, url, None, None)
        assert doc is not None and doc["version"] == 4
        assert [e["kind"] for e in doc["deltas"]] == ["write"]
        assert doc["deltas"][0] == _manifest(s3, 3)["deltas"][-1]
        c.refresh()
        np.testing.assert_array_equal(c.to_numpy(), R)  # row 2 is version 3's, not 2's
        _write(a, R, [5], 5.0)  # a merge of the compaction's kept delta and its own
        np.testing.assert_array_equal(a.to_numpy(), R)
        # a compaction made on version 5 meets a merge of its folded delta with a later
        # commit's: it is made again on the newest version
        c.refresh()
        monkeypatch.setattr(merging, "MERGE_BYTES", 0)
        _write(a, R, [6], 6.0)  # version 6: no merge
        monkeypatch.setattr(merging, "MERGE_BYTES", BUDGET)
        _write(a, R, [7], 7.0)  # version 7: merges 5's (folded by c) with 6's
        assert _manifest(s3, 7)["change"]["merged"] >= 2
        assert compact_objects(c._v, c._versions.deltas, url, None, None) is None
        assert c.compact() == 8
        np.testing.assert_array_equal(c.to_numpy(), R)
    with embstore.open(url) as r:
        assert r.version == 8 and r.info()["pending_rows"] == 0
        np.testing.assert_array_equal(r.to_numpy(), R)
    assert embstore.verify(url).ok


# -- merged key deltas (docs/FORMAT.md §11a, *Merged key deltas*) ------------------------------

def _keyed(s3, rng, rows=100, dim=4):
    url = f"s3://{s3.bucket}/m.emb"
    E = rng.standard_normal((rows, dim)).astype(np.float32)
    keys = [f"w{i}" for i in range(rows)]
    embstore.save(url, E, keys=keys).close()
    return url, E, keys


def _key_entries(doc: dict) -> list[dict]:
    return [e for e in doc["deltas"] if e["array"] == "keys"]


def _append(t, R, keys, new_keys, value: float):
    first = t.append(np.full((len(new_keys), R.shape[1]), value, np.float32), keys=new_keys)
    keys += new_keys
    return np.vstack([R, np.full((len(new_keys), R.shape[1]), value, np.float32)]), first


def _two_appends_then_refresh(a, other, R, keys, names):
    """``a`` appends ``names[0]`` and ``names[1]`` (values 1 and 2), then ``other`` refreshes:
    the next append by ``a`` makes a key merge ``other`` has not seen."""
    R, _ = _append(a, R, keys, [names[0]], 1.0)
    R, _ = _append(a, R, keys, [names[1]], 2.0)
    other.refresh()
    return R


def test_many_keyed_appends_keep_two_key_deltas_and_every_version_finds_its_keys(s3, rng):
    """18 commits (appends of keys, some with non-ASCII and empty keys, and writes): each
    version lists at most two key deltas (a merge and the append's own) covering its
    appended rows; every version, read fresh, finds exactly its keys, as the compacted
    table does; verify checks the merged key deltas' hashes."""
    url, E, keys = _keyed(s3, rng)
    R, refs = E.copy(), {}
    with embstore.open(url, mode="r+", cache_bytes=0) as t:
        for c in range(18):
            if c % 6 == 5:
                ids = np.unique(rng.integers(0, len(R), size=3))
                t.write(ids, np.full((ids.size, 4), c, np.float32))
                R[ids] = c
            else:
                new = [f"k{c}-{j}" for j in range(int(rng.integers(1, 4)))]
                new += ["ключ-%d" % c] if c % 4 == 0 else []
                new += [""] if c == 7 else []
                R, first = _append(t, R, keys, new, float(c))
                assert first.tolist() == list(range(len(R) - len(new), len(R)))
            refs[t.version] = (R.copy(), list(keys))
            doc = _manifest(s3, t.version)
            kent = _key_entries(doc)
            assert len(kent) <= 2, (c, kent)
            assert kent[0]["first_row"] == 100 and \
                kent[-1]["first_row"] + kent[-1]["rows"] == len(R)
            if c >= 2 and c % 6 != 5:  # an append from the third commit on merges
                assert kent[0]["kind"] == "merge" and doc["change"]["merged_keys"] == 2
            assert t.ids_of(keys).tolist() == list(range(len(R)))
    for n, (ref, ks) in refs.items():
        with embstore.open(url, version=n, cache_bytes=0) as r:
            np.testing.assert_array_equal(r.to_numpy(), ref)
            assert r.ids_of(ks).tolist() == list(range(len(ks)))
            assert list(r.keys) == ks
            assert r.ids_of(["nope"], missing=-1).tolist() == [-1]
            np.testing.assert_array_equal(r.lookup_keys(ks[-3:]), ref[-3:])
    assert embstore.verify(url).ok
    with embstore.open(url, mode="r+") as t:
        t.compact()
    with embstore.open(url) as r:  # the compacted table: the same ids for the same keys
        assert r.info()["pending_rows"] == 0
        assert r.ids_of(keys).tolist() == list(range(len(keys)))
        np.testing.assert_array_equal(r.to_numpy(), R)


def test_a_key_merge_is_placed_on_a_winner_that_kept_what_it_merged(s3, rng, monkeypatch):
    """b reads version 2 (two key deltas), merges them in its append, loses to a's version
    3 (no merge) and rebases: its merge goes where those two were, its keys after a's."""
    url, E, keys = _keyed(s3, rng)
    R = E.copy()
    with embstore.open(url, mode="r+") as a, embstore.open(url, mode="r+") as b:
        R, _ = _append(a, R, keys, ["a1", "a2"], 1.0)
        R, _ = _append(a, R, keys, ["a3"], 2.0)
        b.refresh()
        monkeypatch.setattr(merging, "MERGE_BYTES", 0)  # (a's own key delta: smaller)
        R, _ = _append(a, R, keys, ["a4"], 3.0)
        monkeypatch.setattr(merging, "MERGE_BYTES", BUDGET)
        R, first = _append(b, R, keys, ["b1", "b2"], 4.0)
        assert b.version == 4 and first.tolist() == [104, 105]
        assert b.ids_of(keys).tolist() == list(range(106))
    two, three, four = (_manifest(s3, n) for n in (2, 3, 4))
    assert "merged_keys" not in three["change"] and four["change"]["merged_keys"] == 2
    k4 = _key_entries(four)
    assert [e["kind"] for e in k4] == ["merge", "append", "append"]
    assert k4[0]["merged"] == [e["object"] for e in _key_entries(two)]
    assert (k4[0]["first_row"], k4[0]["rows"]) == (100, 3)
    assert k4[1] == _key_entries(three)[-1] and k4[2]["first_row"] == 104
    with embstore.open(url, cache_bytes=0) as r:
        assert r.ids_of(keys).tolist() == list(range(106))
        np.testing.assert_array_equal(r.lookup_keys(["a3", "a4", "b2"]), R[[102, 103, 105]])
    assert embstore.verify(url).ok


def test_a_key_merge_is_left_out_when_the_winner_merged_the_same_and_keys_still_conflict(
        s3, rng):
    url, E, keys = _keyed(s3, rng)
    R = E.copy()
    with embstore.open(url, mode="r+") as a, embstore.open(url, mode="r+") as b:
        R = _two_appends_then_refresh(a, b, R, keys, ["x1", "x2"])
        R, _ = _append(a, R, keys, ["x3", "y"], 3.0)  # version 3: merges 1 and 2
        with pytest.raises(embstore.ConflictError, match=r"\('y'\) were appended by version 3"):
            b.append(np.ones((1, 4), np.float32), keys=["y"])  # a merge hides no conflict
        R, _ = _append(b, R, keys, ["z"], 4.0)  # its merge of 1 and 2 is moot: left out
        assert b.version == 4
    three, four = _manifest(s3, 3), _manifest(s3, 4)
    assert _key_entries(four)[:-1] == _key_entries(three)
    assert "merged_keys" not in four["change"]
    with embstore.open(url, mode="r+") as t:
        t.vacuum(keep=2, cutoff=0)  # (versions 1-2's key deltas and b's merges go)
    named = {f"m.emb/{e['object']}" for n in (3, 4) for e in _manifest(s3, n)["deltas"]}
    assert set(_data(s3)) == named
    with embstore.open(url, cache_bytes=0) as r:
        assert r.ids_of(keys).tolist() == list(range(len(keys)))
        np.testing.assert_array_equal(r.to_numpy(), R)


def test_a_compaction_that_loses_to_a_key_merge_is_made_again(s3, rng):
    url, E, keys = _keyed(s3, rng)
    R = E.copy()
    with embstore.open(url, mode="r+") as a, embstore.open(url, mode="r+") as c:
        R = _two_appends_then_refresh(a, c, R, keys, ["p", "q"])
        R, _ = _append(a, R, keys, ["r"], 3.0)  # version 3: a key merge of 1 and 2
        vocab = c._vocab()
        assert compact_objects(c._v, c._versions.deltas, url, None, vocab.keys_between) is None
        assert c.compact() == 4
        assert c.ids_of(keys).tolist() == list(range(103))
    with embstore.open(url) as r:
        assert r.info()["pending_rows"] == 0 and r.ids_of(keys).tolist() == list(range(103))
        np.testing.assert_array_equal(r.to_numpy(), R)
    assert embstore.verify(url).ok


def test_key_deltas_out_of_row_order_or_hashed_wrong_are_damage(s3, rng):
    url, E, keys = _keyed(s3, rng)
    R = E.copy()
    with embstore.open(url, mode="r+") as t:
        for c in range(3):
            R, _ = _append(t, R, keys, [f"d{c}"], float(c))
    doc = _manifest(s3, 3)
    merge_obj = _key_entries(doc)[0]
    assert merge_obj["kind"] == "merge"
    # the merged key delta's keys hashed under another key: same size, a valid crc32c
    with embstore.open(url) as r:
        segment = r._versions.deltas.segment(r._v.source.client, merge_obj)
        enc, _ = merging.merged_keys([segment])
    bad = key_delta_bytes(enc, hash_encoded(enc, (1, 2)))
    assert len(bad) == merge_obj["bytes"]
    s3.client().put_object(Bucket=s3.bucket, Key=f"m.emb/{merge_obj['object']}", Body=bad)
    report = embstore.verify(url)
    assert not report.ok and any("hashes disagree with the keys" in d.message
                                 for d in report.damaged)
    # a manifest whose key deltas skip rows
    body = {k: v for k, v in doc.items() if k != "crc32c"}
    at = [i for i, e in enumerate(body["deltas"]) if e["array"] == "keys"]
    d = body["deltas"]
    d[at[0]], d[at[1]] = d[at[1]], d[at[0]]
    s3.client().put_object(Bucket=s3.bucket, Key=f"m.emb/{manifest_name(4)}",
                           Body=encode(dict(body, version=4, parent=3)))
    with pytest.raises(embstore.CorruptStoreError, match="key delta .* from row 102, "
                       "expected 100: the manifest is damaged"):
        embstore.open(url)
