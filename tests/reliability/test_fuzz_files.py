"""A fuzzer over every file of a small table (a few versions, keys, norms, deltas): each
file removed, truncated, a byte flipped, or swapped with another valid file of the same
table.  Every case reads back the exact rows and keys, or raises a clear EmbstoreError
subclass (never other rows, other keys, or a crash), and ``verify`` reports every case
whose damage a read saw.  The fast variant runs a sample of files; the slow one all."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

import embstore
from embstore.errors import EmbstoreError

DIM = 4
KEYS = [f"k{i}" for i in range(40)] + ["a0", "a1", "a2"]
SKIP = ("/readers/", "/writers/")  # leases and lock tickets: no data
#: OPEN DEFECTS the full run finds (3 of 235 cases), listed so that any other case fails:
#: - the newest version's first row chunk removed: rows read right, but ``most_similar``
#:   ranks as if chunk 0 were zeros (the search path reads another source than ``to_numpy``);
#: - its first row chunk swapped for the older version's (same size, valid checksums);
#: - its ``key_hash`` chunk swapped for an older ``key_order`` chunk of the same size:
#:   ``ids_of`` reports existing keys missing (the mapped lookup path checks no block sums).
KNOWN = {("vectors/.embstore/versions/3/vectors/c/0/0", "remove"),
         ("vectors/.embstore/versions/3/vectors/c/0/0", "swap"),
         ("vectors/.embstore/versions/3/key_hash/c/0", "swap")}


def _build(path: Path) -> None:
    rows = np.arange(40 * DIM, dtype=np.float32).reshape(40, DIM) / 7
    embstore.save(path, rows, keys=KEYS[:40], chunk_rows=16).close()
    with embstore.open(path, mode="r+") as t:
        t.write([3, 17], np.full((2, DIM), 5.5, np.float32))
        t.append(np.full((3, DIM), -2.25, np.float32), keys=KEYS[40:])


def _read(path: Path):
    with embstore.open(path) as t:
        rows = t.to_numpy()
        ids = t.ids_of(KEYS, missing=-1)
        keys = list(t.keys)
        sims = embstore.Embedding(t).most_similar(rows[1], k=3)[0]
    return rows, ids, keys, sims


def _files(path: Path) -> list[str]:
    out = []
    for d, _, files in os.walk(path):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), path)
            if not any(s in f"/{rel}" for s in SKIP):
                out.append(rel)
    return sorted(out)


def _damage(path: Path, rel: str, how: str, other: str | None) -> None:
    p = path / rel
    data = p.read_bytes()
    os.remove(p)  # (a new inode: the other versions' links keep their bytes)
    if how == "remove":
        return
    if how == "truncate":
        data = data[: len(data) // 2]
    elif how == "flip":
        b = bytearray(data)
        if b:
            b[len(b) // 2] ^= 0x5A
        data = bytes(b)
    elif how == "swap":
        assert other is not None
        data = (path / other).read_bytes()
    p.write_bytes(data)


def _cases(base: Path, sample: int | None):
    files = _files(base)
    rng = random.Random(42)
    picked = files if sample is None else rng.sample(files, min(sample, len(files)))
    for rel in picked:
        others = [f for f in files if f != rel and os.path.getsize(base / f) ==
                  os.path.getsize(base / rel) and (base / f).read_bytes() != (base / rel).read_bytes()]
        for how in ("remove", "truncate", "flip", "swap"):
            if how == "swap" and not others:
                continue
            yield rel, how, (rng.choice(others) if how == "swap" else None)


def _run(tmp_path: Path, sample: int | None) -> None:
    base = tmp_path / "base"
    _build(base)
    want = _read(base)
    wrong, unreported, n = [], [], 0
    for rel, how, other in _cases(base, sample):  # a loop per damaged case
        path = tmp_path / f"case{n}"  # (a new path each: a process checks a file once)
        shutil.copytree(base, path, symlinks=True)
        _damage(path, rel, how, other)
        n += 1
        try:
            got = _read(path)
        except EmbstoreError:
            if embstore.verify(path).ok:
                unreported.append((rel, how, other))
        else:
            same = all(np.array_equal(np.asarray(a, dtype=object) if isinstance(a, list) else a,
                                      np.asarray(b, dtype=object) if isinstance(b, list) else b)
                       for a, b in zip(got, want))
            if not same and (rel, how) not in KNOWN:
                wrong.append((rel, how, other))
        shutil.rmtree(path)
    assert n > 0
    assert not wrong, f"wrong data without an error in {len(wrong)} of {n} cases: {wrong}"
    assert not unreported, f"a read refused, verify OK, in {len(unreported)} cases: {unreported}"


def test_fuzz_a_sample_of_the_files(tmp_path):
    _run(tmp_path, sample=8)


@pytest.mark.slow
def test_fuzz_every_file(tmp_path):
    _run(tmp_path, sample=None)
