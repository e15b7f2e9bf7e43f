"""Commits on object storage under load (slow): many writer processes with readers checking
every read against a replay of the commits, and writers killed at random moments."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import textwrap
import time

import numpy as np
import pytest

import embstore
import forked
from embstore.store.objects.manifest import AREA, list_versions, need_manifest
from embstore.store.place.objstore import ObjectClient
from embstore.store.objects.version import object_log
from s3faults import appended_keys, race, replay, s3, s3_server  # noqa: F401

pytest.importorskip("moto")
pytest.importorskip("obstore")

pytestmark = pytest.mark.slow

_READER = textwrap.dedent("""
    import hashlib, json, os, sys
    import numpy as np
    import embstore
    url, stop, out = sys.argv[1], sys.argv[2], sys.argv[3]
    seen = []
    held = embstore.open(url, cache_bytes=0)
    i = 0
    while not os.path.exists(stop) or i < 2:
        if i % 2:
            held.refresh()
            t = held
        else:
            t = embstore.open(url, cache_bytes=0)
        rows = t.to_numpy()
        ids = np.arange(rows.shape[0])[::-1].copy()
        again = t[ids][::-1]  # a lookup of the same version: the same rows
        seen.append([t.version, hashlib.sha256(rows.tobytes()).hexdigest(),
                     bool(np.array_equal(rows, again))])
        if t is not held:
            t.close()
        i += 1
    json.dump(seen, open(out, "w"))
""")


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


# The suite's run; issue 41's is EMBSTORE_S3_RACE=16x100 (10-25 min: on the merge code, keyed,
# 1,493 commits, 107 conflicts on the hot row, 2,167 reads, 0 torn, 1,347 s at load 18-20),
# kept out of the suite's 10 minutes.
WRITERS, COMMITS = (int(x) for x in os.environ.get("EMBSTORE_S3_RACE", "8x20").split("x"))
READERS = 4


def test_many_writers_and_readers_check_every_read_against_a_replay(s3, rng, tmp_path):
    """16 writer processes x 100 commits (appends, disjoint writes, a shared hot row) and 4
    reader processes: every commit lands once or raises ConflictError on the hot row only,
    every read is one replayed version."""
    url = f"s3://{s3.bucket}/t.emb"
    E = rng.standard_normal((200, 4)).astype(np.float32)
    embstore.save(url, E, keys=[f"k{i}" for i in range(200)]).close()
    stop = tmp_path / "stop"
    readers = [forked.start(_READER, url, stop, tmp_path / f"r{i}.json")
               for i in range(READERS)]
    try:
        logs = race(url, tmp_path, writers=WRITERS, commits=COMMITS, hot_every=7,
                    timeout=3000, keyed=True)  # (16 x 100: 622 s without readers, load 28)
    finally:
        stop.touch()
        for p in readers:
            p.wait(timeout=600)
    refs = replay(E, logs)
    refs[0] = E
    digests = {n: _digest(a) for n, a in refs.items()}
    done = [e for log in logs for e in log if e["v"] is not None]
    conflicts = [e for log in logs for e in log if e["kind"] == "conflict"]
    assert len(done) + len(conflicts) == WRITERS * COMMITS  # every commit landed or raised
    assert all(e["hot"] and e["rows"] == [199] for e in conflicts)  # only real overlaps
    reads = [r for i in range(READERS) for r in json.loads((tmp_path / f"r{i}.json").read_text())]
    assert len(reads) >= 4 and len({v for v, _, _ in reads}) >= 2  # reads across versions
    torn = [(v, d) for v, d, same in reads if digests.get(v) != d or not same]
    print(f"race {WRITERS}x{COMMITS}: {len(done)} commits, {len(conflicts)} conflicts, "
          f"{len(reads)} reads, {len(torn)} torn")  # (shown with -s)
    assert not torn, f"{len(torn)} of {len(reads)} reads match no replayed version"
    newest = max(refs)
    placed = appended_keys(logs)
    with embstore.open(url) as t:
        assert t.version == newest
        np.testing.assert_array_equal(t.to_numpy(), refs[newest])
        assert t.ids_of(list(placed)).tolist() == list(placed.values())  # every key's row
    log = object_log(url)
    assert any(e["change"].get("merged") for e in log)  # (merges of rows and keys raced)
    assert any(e["change"].get("merged_keys") for e in log)
    assert embstore.verify(url).ok


# writers killed, each at a random moment of its commits (EMBSTORE_S3_KILLS=50: issue
# 41's run, 335 s at load 16-18 on the merge code with keys; the suite runs 8)
TRIALS = int(os.environ.get("EMBSTORE_S3_KILLS", "8"))

_KILLED = textwrap.dedent("""
    import json, sys
    import numpy as np
    import embstore
    url, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(seed)
    f = open(out, "a", buffering=1)
    with embstore.open(url, mode="r+", cache_bytes=0) as t:
        for c in range(10_000):
            value = float(seed * 10_000 + c + 1)
            if c % 3 == 2:  # an append of a key (its row and key deltas merge with others)
                key = f"s{seed}-{c}"
                f.write(json.dumps({"intent": value, "key": key}) + "\\n")
                t.append(np.full((1, 4), value, np.float32), keys=[key])
            else:
                ids = np.unique(rng.integers(0, 200, size=4))
                f.write(json.dumps({"intent": value, "ids": ids.tolist()}) + "\\n")
                t.write(ids, np.full((ids.size, 4), value, np.float32))
            f.write(json.dumps({"done": value, "v": t.version}) + "\\n")
""")


def _apply(R: np.ndarray, keys: list[str], e: dict) -> np.ndarray:
    """``R`` with the commit logged as ``e`` (a write of rows, or an append of a key)."""
    if "key" in e:
        keys.append(e["key"])
        return np.vstack([R, np.full((1, R.shape[1]), e["intent"], np.float32)])
    R[e["ids"]] = e["intent"]
    return R


def test_killed_writers_lose_no_committed_row_and_vacuum_clears_their_leftovers(
        s3, rng, tmp_path):
    """Writers of rows and keys SIGKILLed at random moments, one after another: every
    commit logged done is there (and the one in flight only whole, or not at all); the
    table opens as the replay, finds every key, verifies; vacuum past the cutoff removes
    exactly what no version names (killed commits' deltas and merges)."""
    url = f"s3://{s3.bucket}/t.emb"
    E = rng.standard_normal((200, 4)).astype(np.float32)
    keys = [f"k{i}" for i in range(200)]
    embstore.save(url, E, keys=keys).close()
    R = E.copy()
    for trial in range(TRIALS):  # a loop per killed writer
        out = tmp_path / f"k{trial}.log"
        p = forked.start(_KILLED, url, out, trial + 1)  # (a real process, forked: no start-up)
        while not out.exists() or out.stat().st_size == 0:  # (started: it has opened the table)
            time.sleep(0.05)
        time.sleep(float(rng.uniform(0.0, 1.5)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        lines = [json.loads(x) for x in out.read_text().splitlines() if x.endswith("}")]
        intents = [e for e in lines if "intent" in e]
        dones = {e["done"] for e in lines if "done" in e}
        committed = len(object_log(url))
        for e in intents:  # in commit order (one writer)
            if e["intent"] in dones:
                R = _apply(R, keys, e)
        last = intents[-1] if intents else None
        with embstore.open(url) as t:
            rows = t.to_numpy()
            if last is not None and last["intent"] not in dones and (
                    t.ids_of([last["key"]], missing=-1)[0] >= 0 if "key" in last
                    else (rows[last["ids"]] == last["intent"]).all()):
                R = _apply(R, keys, last)  # committed; killed before it was logged
            np.testing.assert_array_equal(rows, R)
            assert t.ids_of(keys).tolist() == list(range(len(keys)))
            assert t.version == committed
        if trial % 10 == 9:  # (verify reads every retained manifest and delta: not each time)
            assert embstore.verify(url).ok
    log = object_log(url)
    assert any(e["change"].get("merged") for e in log)
    assert any(e["change"].get("merged_keys") for e in log)
    assert embstore.verify(url).ok
    with embstore.open(url, mode="r+") as t:
        t.vacuum(keep=10_000, cutoff=0)
    client = ObjectClient(url)
    try:
        named = {e["object"] for n, _, _ in list_versions(client)
                 for e in need_manifest(client, n)["deltas"]}
    finally:
        client.close()
    cut = len(url.split("/", 3)[3]) + 1
    left = {k[cut:] for k in _keys(s3, url) if k[cut:].startswith(f"{AREA}data/")}
    assert left == named  # every leftover of a killed commit is gone, nothing needed is
    with embstore.open(url) as t:
        np.testing.assert_array_equal(t.to_numpy(), R)
        assert t.ids_of(keys).tolist() == list(range(len(keys)))


def _keys(s3, url: str) -> list[str]:
    prefix = url.split("/", 3)[3] + "/"
    out, token = [], None
    while True:
        kw = {"ContinuationToken": token} if token else {}
        res = s3.client().list_objects_v2(Bucket=s3.bucket, Prefix=prefix, **kw)
        out += [o["Key"] for o in res.get("Contents", [])]
        if not res.get("IsTruncated"):
            return out
        token = res["NextContinuationToken"]

