"""Writes, appends and versions of tables on object storage (docs/FORMAT.md §11a), against
moto's S3 server on loopback: exact rows against a NumPy replay of the commits, races
between handles and processes, lost responses through a fault proxy, vacuum, costs."""

from __future__ import annotations


import json

import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from zarr.storage import ObjectStore

import embstore
from embstore import ConflictError, EmbstoreError, ReadOnlyError
from embstore.cli import cli
from embstore.store.objects.manifest import AREA, manifest_name
from embstore.store.objects.version import object_log
from embstore.store.place.objstore import ObjectClient
from embstore.dtypes import DTYPES
from s3faults import FaultProxy, race, random_faults, replay, s3, s3_server  # noqa: F401

pytest.importorskip("moto")
pytest.importorskip("obstore")

DTYPES_INT8 = DTYPES["int8"]

def _table(s3, rng, rows=600, dim=8, name="t.emb", **layout):
    url = f"s3://{s3.bucket}/{name}"
    E = rng.standard_normal((rows, dim)).astype(np.float32)
    embstore.save(url, E, **layout).close()
    return url, E


def _objects(s3, prefix: str) -> dict[str, int]:
    out, token = {}, None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        res = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix, **kw)
        out.update({o["Key"]: o["Size"] for o in res.get("Contents", [])})
        if not res.get("IsTruncated"):
            return out
        token = res["NextContinuationToken"]


def test_writes_and_appends_make_versions_read_exactly(s3, rng):
    url, E = _table(s3, rng, chunk_rows=64)
    refs = {0: E.copy()}
    with embstore.open(url, mode="r+") as t:
        assert t.version == 0
        for step in range(6):
            if step % 3 == 2:
                new = rng.standard_normal((int(rng.integers(1, 50)), 8)).astype(np.float32)
                got = t.append(new)
                np.testing.assert_array_equal(got, np.arange(len(E), len(E) + len(new)))
                E = np.vstack([E, new])
            else:
                ids = rng.integers(0, len(E), size=40)
                vals = rng.standard_normal((40, 8)).astype(np.float32)
                t.write(ids, vals)
                E[ids[::-1]] = vals[::-1]  # (NumPy's last write would win the other way)
                E[ids] = vals  # the last write of a repeated id wins, as in NumPy
            refs[t.version] = E.copy()
            np.testing.assert_array_equal(t.to_numpy(), E)
    assert sorted(refs) == list(range(7))
    for n, ref in refs.items():
        with embstore.open(url, version=n if n else None) if n else embstore.open(url) as r:
            if n:
                assert r.version == n
            else:  # (version 0 is the upload, not retained by number: the newest opens)
                assert r.version == 6
                ref = refs[6]
            np.testing.assert_array_equal(r.to_numpy(), ref)
            ids = rng.integers(0, len(ref), size=(7, 9))
            np.testing.assert_array_equal(r[ids], ref[ids])
    log = object_log(url)
    assert [e["version"] for e in log] == list(range(1, 7))
    assert [e["change"]["kind"] for e in log] == ["write", "write", "append"] * 2
    assert [e["rows"] for e in log] == [len(refs[n]) for n in range(1, 7)]
    with embstore.open(url) as r:
        assert r.info()["pending_rows"] == int(np.unique(np.r_[
            np.flatnonzero((refs[6][:600] != refs[0]).any(1)), np.arange(600, len(E))]).size) \
            or r.info()["pending_rows"] >= len(E) - 600


def test_a_reader_keeps_its_version_until_refresh(s3, rng):
    url, E = _table(s3, rng)
    with embstore.open(url) as r, embstore.open(url, mode="r+") as w:
        w.write([5], np.full((1, 8), 7, np.float32))
        np.testing.assert_array_equal(r[5], E[5])  # a snapshot: its own version
        r.refresh()
        assert r.version == 1
        np.testing.assert_array_equal(r[5], np.full(8, 7, np.float32))


def test_overlapping_writes_raise_conflict_and_disjoint_ones_rebase(s3, rng):
    url, E = _table(s3, rng)
    a, b = embstore.open(url, mode="r+"), embstore.open(url, mode="r+")
    try:
        one = np.ones((3, 8), np.float32)
        a.write([1, 2, 3], one)
        with pytest.raises(ConflictError, match=r"1 row\(s\) this write sets \(3\) were written "
                           r"by version 1") as err:
            b.write([3, 4], 2 * one[:2])  # b still reads version 0
        assert isinstance(err.value, EmbstoreError) and err.value.rows.tolist() == [3]
        assert err.value.version == 1
        b.write([10, 11], 3 * one[:2])  # disjoint from version 1: rebased onto it
        assert b.version == 2
        E[[1, 2, 3]] = 1
        E[[10, 11]] = 3
        np.testing.assert_array_equal(b.to_numpy(), E)  # a's rows too
        first = a.append(4 * one)  # a reads version 1: rebased on 2
        assert first.tolist() == [600, 601, 602] and a.version == 3
        second = b.append(5 * one[:1])  # b reads 2: its row comes after a's
        assert second.tolist() == [603] and b.version == 4
        E = np.vstack([E, 4 * one, 5 * one[:1]])
    finally:
        a.close()
        b.close()
    with embstore.open(url) as r:
        assert r.version == 4
        np.testing.assert_array_equal(r.to_numpy(), E)


def test_read_only_handles_and_unsupported_writes_say_so(s3, rng):
    url, E = _table(s3, rng)
    with embstore.open(url) as t, pytest.raises(ReadOnlyError):
        t.write([0], E[:1])
    with pytest.raises(embstore.InvalidOptionError, match="read only"):
        embstore.open(url, mode="r+", version=1)
    with embstore.open(url, mode="r+") as t:
        t.write([0], E[:1] * 2)
    with pytest.raises(EmbstoreError, match="no version 7 .*holds versions \\[1\\]"):
        embstore.open(url, version=7)
    kurl = f"s3://{s3.bucket}/k.emb"
    embstore.save(kurl, E, keys=[f"w{i}" for i in range(len(E))]).close()
    with embstore.open(kurl, mode="r+") as t:
        t.write([4], E[:1])  # rows of a keyed table can be written
        np.testing.assert_array_equal(t[4], E[0])
        assert t.ids_of(["w4"]).tolist() == [4]


def test_a_write_costs_its_rows_and_two_requests(s3, rng):
    """10,000 random rows of a 100,000 x 64 table: one delta object (the rows, their ids
    and a header) plus the manifest and the hint; no GET or LIST."""
    url, E = _table(s3, rng, rows=100_000, dim=64)
    ids = np.unique(rng.integers(0, len(E), size=12_000))[:10_000]
    vals = rng.standard_normal((ids.size, 64)).astype(np.float32)
    with embstore.open(url, mode="r+", cache_bytes=0) as t:
        before = _objects(s3, f"t.emb/{AREA}")
        s3.reset()
        t.write(ids, vals)
        assert dict(s3.requests) == {"PUT": 3}  # the delta, the manifest, the hint
        after = _objects(s3, f"t.emb/{AREA}")
    new = {k: n for k, n in after.items() if k not in before}
    data = {k: n for k, n in new.items() if "/data/" in k}
    assert len(data) == 1
    uploaded = sum(new.values())
    print(f"10,000 rows ({vals.nbytes} bytes): uploaded {uploaded} bytes in "
          f"{s3.requests['PUT']} PUTs")
    assert uploaded <= 2 * vals.nbytes, (uploaded, vals.nbytes)
    assert sum(data.values()) <= vals.nbytes + ids.size * 8 + 256
    E[ids] = vals
    with embstore.open(url, cache_bytes=0) as r:
        probe = rng.integers(0, len(E), size=4096)
        np.testing.assert_array_equal(r[probe], E[probe])
        np.testing.assert_array_equal(r[ids[:500]], vals[:500])


def test_vacuum_keeps_what_retained_versions_and_young_commits_need(s3, rng):
    url, E = _table(s3, rng)
    refs = {}
    with embstore.open(url, mode="r+") as t:
        for i in range(5):
            t.write([i], np.full((1, 8), i + 10, np.float32))
            E[i] = i + 10
            refs[t.version] = E.copy()
        # a killed commit: its delta uploaded, its manifest never made
        src = t._source
        src.client.put(f"{AREA}data/{'ab' * 16}.vectors", b"partial")
        assert t.vacuum(keep=2) == []  # everything younger than the cutoff stays
        # five deltas, the merges of commits 3, 4 and 5 (each of the two before), the partial
        assert len(_objects(s3, f"t.emb/{AREA}data/")) == 9
        removed = t.vacuum(keep=2, cutoff=0)
    assert removed == [1, 2, 3]
    left = _objects(s3, f"t.emb/{AREA}")
    assert f"t.emb/{AREA}data/{'ab' * 16}.vectors" not in left
    named = {f"t.emb/{e['object']}" for n in (4, 5) for e in json.loads(s3.client().get_object(
        Bucket=s3.bucket, Key=f"t.emb/{manifest_name(n)}")["Body"].read())["deltas"]}
    assert {k for k in left if "/data/" in k} == named and len(named) == 4
    assert sorted(k for k in left if "/v0" in k) == [f"t.emb/{manifest_name(n)}" for n in (4, 5)]
    for n in (4, 5):
        with embstore.open(url, version=n) as r:
            np.testing.assert_array_equal(r.to_numpy(), refs[n])
    with pytest.raises(EmbstoreError, match="no version 2"):
        embstore.open(url, version=2)
    assert _objects(s3, "t.emb/vectors/c/")  # the published view is never touched


@pytest.mark.parametrize("commits", [8, pytest.param(40, marks=pytest.mark.slow)])
def test_lost_responses_resets_and_503s_make_no_spurious_conflict_nor_double_commit(
        s3, rng, monkeypatch, commits):
    """Two handles, each behind the other (every commit rebases), writing rows and
    appending keys through a proxy that drops manifest PUTs' responses after the server
    applied them, resets PUTs and answers 503s: every commit lands once, row and key
    merges included, and the table opens (as the replay) and verifies after each."""
    keys = [f"w{i}" for i in range(400)]
    url, E = _table(s3, rng, rows=400, keys=keys)
    proxy = FaultProxy(s3.endpoint, random_faults(7, drop=0.35, reset=0.1, slow=0.15))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        a, b = embstore.open(url, mode="r+"), embstore.open(url, mode="r+")
        for i in range(commits):
            h = (a, b)[i % 2]
            if i % 3 == 0:
                new = [f"n{i}a", f"n{i}b"]
                assert h.append(np.full((2, 8), i + 1, np.float32), keys=new).tolist() == [
                    len(E), len(E) + 1]
                E = np.vstack([E, np.full((2, 8), i + 1, np.float32)])
                keys += new
            else:
                rows = np.array([i * 10 + (i % 2), i * 10 + 5])
                h.write(rows, np.full((2, 8), i + 1, np.float32))
                E[rows] = i + 1
            with embstore.open(url, cache_bytes=0) as r:
                assert r.version == i + 1
                np.testing.assert_array_equal(r.to_numpy(), E)
                assert r.ids_of(keys).tolist() == list(range(len(keys)))
            if i % 4 == 3:
                assert embstore.verify(url).ok
        a.close()
        b.close()
    finally:
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
        proxy.close()
    assert proxy.faults["drop"] > 0 and proxy.faults["503"] > 0 and proxy.faults["reset"] > 0
    log = object_log(url)
    assert [e["version"] for e in log] == list(range(1, commits + 1))  # none lost, none twice
    assert len({e["write_id"] for e in log}) == commits
    assert any(e["change"].get("merged") for e in log)  # rows merged on rebased commits
    assert any(e["change"].get("merged_keys") for e in log)  # and key deltas
    with embstore.open(url) as r:
        np.testing.assert_array_equal(r.to_numpy(), E)
        assert r.ids_of(keys).tolist() == list(range(len(keys)))
        assert embstore.verify(url).ok


@pytest.mark.parametrize("writers,commits", [(2, 5), pytest.param(4, 15,
                                                                   marks=pytest.mark.slow)])
def test_racing_writer_processes_lose_nothing(s3, rng, tmp_path, writers, commits):
    url, E = _table(s3, rng, rows=200, dim=4)
    logs = race(url, tmp_path, writers=writers, commits=commits)
    conflicts = [e for log in logs for e in log if e["kind"] == "conflict"]
    assert all(e["hot"] and e["rows"] == [199] for e in conflicts)  # only true overlaps
    refs = replay(E, logs)
    newest = max(refs)
    with embstore.open(url) as r:
        assert r.version == newest
        np.testing.assert_array_equal(r.to_numpy(), refs[newest])
    for n in sorted(refs)[-8:]:  # the retained ones
        with embstore.open(url, version=n) as r:
            np.testing.assert_array_equal(r.to_numpy(), refs[n])


def test_compaction_makes_a_base_and_a_stale_writer_rebases_onto_it(s3, rng):
    url, E = _table(s3, rng, keys=None, chunk_rows=64)
    keys_url = f"s3://{s3.bucket}/k.emb"
    keys = [f"w{i}" for i in range(len(E))]
    embstore.save(keys_url, E, keys=keys, chunk_rows=64).close()
    for u in (url, keys_url):
        R = E.copy()
        with embstore.open(u, mode="r+") as a, embstore.open(u, mode="r+") as b:
            a.write([3, 4], np.full((2, 8), 1, np.float32))
            R[[3, 4]] = 1
            if u == url:
                a.append(np.full((5, 8), 2, np.float32))
                R = np.vstack([R, np.full((5, 8), 2, np.float32)])
            assert a.info()["pending_rows"] == (7 if u == url else 2)
            v = a.compact()
            assert a.info()["pending_rows"] == 0 and a.version == v
            np.testing.assert_array_equal(a.to_numpy(), R)
            b.write([9], np.full((1, 8), 3, np.float32))  # b reads version 0: rebased
            R[9] = 3
            assert b.version == v + 1
            np.testing.assert_array_equal(b.to_numpy(), R)  # (its handle reads the new base)
        with embstore.open(u) as r:
            np.testing.assert_array_equal(r.to_numpy(), R)
            assert r.info()["pending_rows"] == 1
            if u == keys_url:
                assert r.ids_of(["w9", "w599"]).tolist() == [9, 599]
        with embstore.open(u, version=1) as r:  # before the compaction: its own base
            np.testing.assert_array_equal(r[[3, 9]], np.stack([np.ones(8, np.float32), E[9]]))
    # Zarr readers of the URL read the published view: the table as uploaded
    client = ObjectClient(url)
    try:
        z = zarr.open_group(store=ObjectStore(client.prefixed_store(), read_only=True), mode="r")
        np.testing.assert_array_equal(z["vectors"][:], E)
    finally:
        client.close()


def test_the_commands_tell_one_story_of_an_s3_table(s3, rng, tmp_path):
    url, E = _table(s3, rng)
    runner = CliRunner()
    res = runner.invoke(cli, ["log", url])
    assert res.exit_code == 0 and "no commits yet" in res.output
    with embstore.open(url, mode="r+") as t:
        t.write([2], np.full((1, 8), 9, np.float32))
        t.append(np.full((2, 8), 4, np.float32))
    res = runner.invoke(cli, ["log", url, "--json"])
    doc = json.loads(res.output)
    assert doc["version"] == 2 and [v["change"]["kind"] for v in doc["versions"]] == [
        "write", "append"]
    info = json.loads(runner.invoke(cli, ["info", url, "--json"]).output)
    assert (info["version"], info["vocab_size"], info["pending_rows"]) == (2, 602, 3)
    np.save(tmp_path / "ids.npy", np.array([2, 601]))
    for version, want in ((1, [np.full(8, 9, np.float32), None]),
                          (2, [np.full(8, 9, np.float32), np.full(8, 4, np.float32)])):
        if want[1] is None:  # row 601 does not exist in version 1
            res = runner.invoke(cli, ["lookup", url, str(tmp_path / "ids.npy"),
                                      str(tmp_path / "o.npy"), "--version", "1", "--quiet"])
            assert res.exit_code == 1 and "601" in res.output
            continue
        res = runner.invoke(cli, ["lookup", url, str(tmp_path / "ids.npy"),
                                  str(tmp_path / "o.npy"), "--version", str(version),
                                  "--overwrite", "--quiet"])
        assert res.exit_code == 0, res.output
        np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), np.stack(want))
    res = runner.invoke(cli, ["verify", url])
    assert res.exit_code == 0 and "manifest 1, manifest 2" in res.output
    res = runner.invoke(cli, ["compact", url])
    assert res.exit_code == 0 and "version 2 -> 3" in res.output
    res = runner.invoke(cli, ["vacuum", url, "--keep", "1", "--cutoff", "0"])
    assert res.exit_code == 0 and "removed 2 version(s) (1, 2)" in res.output
    res = runner.invoke(cli, ["upgrade", url])
    assert res.exit_code == 1 and "upgrade a local copy" in res.output


def test_appends_of_keys_rebase_unless_a_key_is_taken(s3, rng):
    url = f"s3://{s3.bucket}/k.emb"
    E = rng.standard_normal((100, 4)).astype(np.float32)
    keys = [f"w{i}" for i in range(100)]
    embstore.save(url, E, keys=keys).close()
    one = np.ones((1, 4), np.float32)
    with embstore.open(url, mode="r+") as a, embstore.open(url, mode="r+") as b:
        assert a.append(2 * one.repeat(2, 0), keys=["x", "y"]).tolist() == [100, 101]
        with pytest.raises(ConflictError, match=r"1 key\(s\) this append adds \('y'\) were "
                           "appended by version 1") as err:
            b.append(3 * one, keys=["y"])
        assert err.value.keys == ["y"] and err.value.rows.size == 0
        assert b.append(4 * one, keys=["z"]).tolist() == [102]  # rebased after a's rows
        with pytest.raises(embstore.ShapeMismatchError, match="key 'w5' already exists"):
            a.append(one, keys=["w5"])
        R = np.vstack([E, 2 * one, 2 * one, 4 * one])
        keys += ["x", "y", "z"]
        with embstore.open(url) as r:
            np.testing.assert_array_equal(r.to_numpy(), R)
            assert r.ids_of(["x", "y", "z", "w5", "nope"], missing=-1).tolist() == [
                100, 101, 102, 5, -1]
            assert list(r.keys[98:103]) == keys[98:103]
        assert a.compact() == 3  # a read version 1: it compacts the newest, keys and all
        with embstore.open(url) as r:
            assert r.info()["pending_rows"] == 0
            np.testing.assert_array_equal(r.lookup_keys(["z", "w7"]), R[[102, 7]])
            assert r.ids_of(keys).tolist() == list(range(103))
        assert embstore.verify(url).ok


def test_the_client_makes_conditional_writes_and_lists_after_a_name(s3):
    client = ObjectClient(f"s3://{s3.bucket}/c")
    try:
        assert client.put_new("a/x", b"1", "w1") == "created"
        assert client.put_new("a/x", b"2", "w2") == "exists"  # 412: If-None-Match: *
        assert client.get("a/x") == b"1"
        etag = client.head("a/x")["e_tag"]
        assert client.put_if_match("a/x", b"3", '"not-it"', "w3") == "exists"  # 412: If-Match
        assert client.put_if_match("a/x", b"4", etag, "w4") == "created"
        assert client.get("a/x") == b"4"
        for name in ("a/v1", "a/v2", "a/v3", "b/v4"):
            client.put(name, b"")
        assert [r for r, _, _ in client.list_after("a", "a/v1")] == ["a/v2", "a/v3", "a/x"]
        assert [r for r, _, _ in client.list_after("a/", None, pages=1)] == [
            "a/v1", "a/v2", "a/v3", "a/x"]
    finally:
        client.close()


def test_verify_names_a_damaged_delta_and_the_open_refuses_it(s3, rng):
    url, E = _table(s3, rng)
    with embstore.open(url, mode="r+") as t:
        t.write([1, 2], np.ones((2, 8), np.float32))
        t.compact()
        t.write([3], np.ones((1, 8), np.float32))
    report = embstore.verify(url)
    assert report.ok and "manifest 3" in report.arrays
    (key,) = [k for k in _objects(s3, f"t.emb/{AREA}data/") if k.endswith(".vectors")
              and k in {f"t.emb/{e['object']}" for e in
                        embstore.open(url)._source.doc["deltas"]}]
    c = s3.client()
    body = bytearray(c.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[-10] ^= 1
    c.put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))
    report = embstore.verify(url)
    assert not report.ok
    assert [d.message for d in report.damaged] == [
        f"s3://{s3.bucket}/{key}: crc32c mismatch: the delta is damaged"]
    with pytest.raises(embstore.CorruptStoreError, match="crc32c mismatch: the delta is damaged"):
        embstore.open(url)
    with embstore.open(url, version=2) as r:  # the compacted version needs no delta
        np.testing.assert_array_equal(r[[1, 3]], np.stack([np.ones(8, np.float32), E[3]]))


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_int8_and_bfloat16_tables_on_s3_take_writes_as_local_ones_do(s3, rng, tmp_path, dtype):
    """Deltas of the stored values (codes; int8's row scales beside them): every version reads
    (rows and raw codes) exactly as the same commits on a local table, and NumPy's encoding of
    the rows written; compaction copies the codes, changing no row."""
    rec = DTYPES[dtype]
    E = rng.standard_normal((300, 8)).astype(np.float32)
    url = f"s3://{s3.bucket}/{dtype}.emb"
    embstore.save(url, E, dtype=dtype, chunk_rows=64).close()
    local = tmp_path / "t.emb"
    embstore.save(local, E, dtype=dtype, chunk_rows=64).close()
    R = rec.stored(E)  # what the table holds: NumPy's reference
    refs = {}
    with embstore.open(url, mode="r+") as t, embstore.open(local, mode="r+") as u:
        for step in range(4):
            if step == 2:
                new = (3 * rng.standard_normal((7, 8))).astype(np.float32)
                assert t.append(new).tolist() == u.append(new).tolist() == list(range(300, 307))
                R = np.vstack([R, rec.stored(new)])
            else:
                ids = np.unique(rng.integers(0, len(R), size=5))  # (two rows of 300: local
                vals = (5 * rng.standard_normal((ids.size, 8))).astype(np.float32)  # folds)
                t.write(ids, vals)
                u.write(ids, vals)
                R[ids] = rec.stored(vals)
            refs[t.version] = R.copy()
            np.testing.assert_array_equal(t.to_numpy(), R)
            every = np.arange(len(R))
            for a, b in zip(t.raw(every), u.raw(every)):  # codes, scale, offset as stored
                np.testing.assert_array_equal(a, b)
        assert t.info()["pending_rows"] > 0 and t.storage_dtype == dtype
        before = t.raw(np.arange(len(R)))
        v = t.compact()
        assert t.info()["pending_rows"] == 0
        np.testing.assert_array_equal(t.to_numpy(), R)  # no row changed
        for a, b in zip(t.raw(np.arange(len(R))), before):
            np.testing.assert_array_equal(a, b)
        t.write([1], E[2:3])
        R[1] = rec.stored(E[2:3])[0]
        refs[v + 1] = R.copy()
    for n, ref in refs.items():
        with embstore.open(url, version=n) as r:
            np.testing.assert_array_equal(r.to_numpy(), ref)
            assert r.storage_dtype == dtype
    doc = json.loads(s3.client().get_object(Bucket=s3.bucket, Key=f"{dtype}.emb/{manifest_name(1)}")
                     ["Body"].read())
    assert doc["dtype"] == dtype
    arrays = sorted(e["array"] for e in doc["deltas"])
    assert arrays == (["row_scale", "vectors"] if dtype == "int8" else ["vectors"])
    vec = next(e for e in doc["deltas"] if e["array"] == "vectors")
    assert vec["bytes"] < vec["rows"] * (8 + 8 * rec.code.itemsize) + 200  # codes, not floats
    assert embstore.verify(url).ok


def test_a_bfloat16_row_that_rounds_to_infinity_is_refused_on_s3(s3, rng):
    E = rng.standard_normal((50, 4)).astype(np.float32)
    url = f"s3://{s3.bucket}/b.emb"
    embstore.save(url, E, dtype="bfloat16").close()
    with embstore.open(url, mode="r+") as t:
        big = np.full((1, 4), np.finfo(np.float32).max, np.float32)
        with pytest.raises(embstore.ShapeMismatchError, match="rounds to infinity"):
            t.write([3], big)
        assert t.version == 0
    assert object_log(url) == []


def test_training_a_table_on_s3_is_refused_with_the_reason(s3, rng, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import embstore.torch as et
    url, E = _table(s3, rng, rows=50)
    monkeypatch.chdir(tmp_path)  # (no local folder named after the URL may appear)
    with embstore.open(url, mode="r+") as t:
        t.write([1], E[:1])  # (a versioned table: version 1)
        with pytest.raises(ReadOnlyError, match="training a table on object storage is not "
                           "supported: its optimizer state"):
            et.Embedding(t, optimizer="sgd", lr=0.1)
        assert t.version == 1
    assert list(tmp_path.iterdir()) == []
    assert torch is not None


def test_a_commit_past_the_threshold_is_compacted_after_it(s3, rng):
    """``objects.compact.compact_if_due`` (``ZarrTable.compact_if_due()`` on S3): nothing
    below 5% of the rows in deltas; past it, a compaction of its own, no row changed, keys
    kept; a handle left behind rebases onto it."""
    from embstore.store.objects.compact import COMPACT_FRACTION, compact_if_due
    keys = [f"w{i}" for i in range(400)]
    url = f"s3://{s3.bucket}/auto.emb"
    E = rng.standard_normal((400, 8)).astype(np.float32)
    embstore.save(url, E, keys=keys, dtype="int8").close()
    R = DTYPES_INT8.stored(E)
    with embstore.open(url, mode="r+") as t, embstore.open(url, mode="r+") as behind:
        below = int(COMPACT_FRACTION * 400)  # 20 rows: not past it
        t.write(np.arange(below), E[100:100 + below])
        R[:below] = DTYPES_INT8.stored(E[100:100 + below])
        assert compact_if_due(t._v, t._versions.deltas, t.path, None) is None
        assert t.version == 1 and len(object_log(url)) == 1
        t.append(E[:2] * 2, keys=["new0", "new1"])  # 22 rows pending: past 5% of 402
        R = np.vstack([R, DTYPES_INT8.stored(E[:2] * 2)])
        doc = compact_if_due(t._v, t._versions.deltas, t.path, None)
        assert doc is not None and doc["version"] == 3 and doc["deltas"] == []
        assert doc["base"]["prefix"].startswith(f"{AREA}base-")
        with embstore.open(url) as r:
            assert r.version == 3 and r.info()["pending_rows"] == 0
            np.testing.assert_array_equal(r.to_numpy(), R)
            assert r.ids_of(["new1", "w7"]).tolist() == [401, 7]
        behind.write([399], E[:1])  # read version 0: rebased onto the compaction
        R[399] = DTYPES_INT8.stored(E[:1])[0]
        assert behind.version == 4
    with embstore.open(url) as r:
        np.testing.assert_array_equal(r.to_numpy(), R)
    assert embstore.verify(url).ok
