"""A fuzzer over every file of a small table (a few versions, keys, norms, deltas), in each
layout and storage dtype (rows at a fixed stride, sharded, compressed; float32, int8,
bfloat16): each file removed, truncated, a byte flipped, swapped with another valid file of
the same size of the same table, or swapped with the file of the same name of its *twin*
(another table of the same shape, dtype and keys, built by the same calls from other
values); and the newest version's directory removed, replaced by the one before, or copied
as a version after it.  Every case reads back the exact rows, keys and neighbours, or
raises a clear EmbstoreError subclass (never other rows, other keys, or a crash), and
``verify`` reports every case (exit 1: the bytes of the table are not the ones it wrote).
The fast variant runs a sample of cases of one layout; the slow one every case of each."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

import embstore
from embstore.errors import EmbstoreError, NotATableError
from embstore.store.versions.pinning import in_place

DIM = 4
KEYS = [f"k{i}" for i in range(40)] + ["a0", "a1", "a2"]
SKIP = ("/readers/", "/writers/")  # leases and lock tickets: no data
NEWEST = "vectors/.embstore/versions/3"
LAYOUTS = {"sharded": dict(chunk_rows=16), "rows": {}, "int8": dict(dtype="int8"),
           "bfloat16-zstd": dict(dtype="bfloat16", compression="zstd")}
def _build(path: Path, layout: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((40, DIM)).astype(np.float32)
    embstore.save(path, rows, keys=KEYS[:40], **LAYOUTS[layout]).close()
    with embstore.open(path, mode="r+") as t:
        t.write([3, 17], rng.standard_normal((2, DIM)).astype(np.float32))
        t.append(rng.standard_normal((3, DIM)).astype(np.float32), keys=KEYS[40:])


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


def _damage(path: Path, rel: str, how: str, other: Path | None) -> None:
    p = path / rel
    if how in ("rmdir", "older", "copy"):  # the newest version's directory
        versions = p.parent
        if how == "copy":
            shutil.copytree(p, versions / "4", symlinks=True)
            return
        shutil.rmtree(p)
        if how == "older":
            shutil.copytree(versions / "2", p, symlinks=True)
        return
    data = p.read_bytes()
    os.remove(p)  # (a new inode: the other versions' links keep their bytes)
    if how == "remove":
        return
    if how == "truncate":
        data = data[: len(data) // 2]
    elif how == "flip":
        b = bytearray(data)
        if b:
            b[_flip_at(path, rel, len(b))] ^= 0x5A
        data = bytes(b)
    elif how in ("swap", "twin"):
        assert other is not None
        data = other.read_bytes()
    p.write_bytes(data)


def _flip_at(path: Path, rel: str, size: int) -> int:
    """The byte a flip changes: the middle, but in a row array's chunk a committed byte
    (row 0: its padding past the last row is never read, so no damage)."""
    snap, inner = path, rel
    parts = rel.split("/")
    if parts[:3] == ["vectors", ".embstore", "versions"] and len(parts) > 4:
        snap, inner = path.joinpath(*parts[:4]), "/".join(parts[4:])
    return 5 if in_place(snap, inner) else size // 2


def _cases(base: Path, twin: Path):
    """``(file, how, other file)`` of every case (``other``: what a swap puts in place)."""
    files = _files(base)
    rng = random.Random(42)
    for rel in files:
        size, data = os.path.getsize(base / rel), (base / rel).read_bytes()
        others = [f for f in files if f != rel and os.path.getsize(base / f) == size and
                  (base / f).read_bytes() != data]
        for how in ("remove", "truncate", "flip"):
            yield rel, how, None
        if others:
            yield rel, "swap", base / rng.choice(others)
        if (twin / rel).is_file() and (twin / rel).read_bytes() != data:
            yield rel, "twin", twin / rel
    for how in ("rmdir", "older", "copy"):
        yield NEWEST, how, None


def _verified(path: Path) -> bool:
    """Whether ``verify`` finds the table sound (a table without its group ``zarr.json`` is
    no table: the command line says so, exit 1)."""
    try:
        return embstore.verify(path).ok
    except NotATableError:
        return False


def _same(got, want) -> bool:
    return all(np.array_equal(np.asarray(a, dtype=object) if isinstance(a, list) else a,
                              np.asarray(b, dtype=object) if isinstance(b, list) else b)
               for a, b in zip(got, want))


def _run(tmp_path: Path, layout: str, sample: int | None, part: slice = slice(None)) -> int:
    base, twin = tmp_path / "base", tmp_path / "twin"
    _build(base, layout, seed=1)
    _build(twin, layout, seed=2)
    want = _read(base)
    assert not _same(_read(twin), want)  # (a twin whose files would be no swap at all)
    cases = list(_cases(base, twin))
    if sample is not None:
        cases = random.Random(7).sample(cases, sample)
    cases = cases[part]
    wrong, unreported, n = [], [], 0
    for rel, how, other in cases:  # a loop per damaged case
        path = tmp_path / f"case{n}"  # (a new path each: a process checks a file once)
        shutil.copytree(base, path, symlinks=True)
        _damage(path, rel, how, other)
        n += 1
        try:
            got = _read(path)
        except EmbstoreError:
            pass
        else:
            if not _same(got, want):
                wrong.append((rel, how, str(other)))
        if _verified(path):
            unreported.append((rel, how, str(other)))
        shutil.rmtree(path)
    assert n > 0
    assert not wrong, f"wrong data without an error in {len(wrong)} of {n} cases: {wrong}"
    assert not unreported, f"verify OK for a damaged table in {len(unreported)} cases: " \
                           f"{unreported}"
    return n


def test_fuzz_a_sample_of_the_files(tmp_path):
    _run(tmp_path, "rows", sample=10)


def test_the_named_cases_of_fixed_defects(tmp_path):
    """The cases the fuzzer found (each returned wrong rows or keys without an error): the
    newest shard removed (it read as zeros), a key_hash chunk swapped for a key_order
    chunk of the same size (ids_of missed existing keys), the twin's key_hash chunk, and
    a shard (rows, norms) swapped for another valid shard of the same layout."""
    base, twin = tmp_path / "base", tmp_path / "twin"
    _build(base, "sharded", seed=1)
    _build(twin, "sharded", seed=2)
    v = "vectors/.embstore/versions"
    for i, (rel, how, other) in enumerate([
            (f"{NEWEST}/vectors/c/0/0", "remove", None),
            (f"{NEWEST}/key_hash/c/0", "swap", base / "key_order/c/0"),
            (f"{NEWEST}/key_hash/c/0", "twin", twin / "key_hash/c/0"),
            # a shard swapped for another valid shard of the same size and layout (an older
            # version's, the twin table's): it read that shard's rows before shard tags
            (f"{NEWEST}/vectors/c/0/0", "swap", base / f"{v}/1/vectors/c/0/0"),
            (f"{NEWEST}/vectors/c/0/0", "twin", twin / f"{NEWEST}/vectors/c/0/0"),
            (f"{NEWEST}/norms/c/0/0", "twin", twin / f"{NEWEST}/norms/c/0/0")]):
        path = tmp_path / f"case-{i}-{how}"
        shutil.copytree(base, path, symlinks=True)
        _damage(path, rel, how, other)
        assert how == "remove" or (path / rel).read_bytes() != (base / rel).read_bytes()
        with pytest.raises(embstore.CorruptStoreError, match="manifest names it|records"):
            _read(path)
        assert not embstore.verify(path).ok
        shutil.rmtree(path)


@pytest.mark.slow
@pytest.mark.parametrize("half", [0, 1], ids=["even-cases", "odd-cases"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fuzz_every_file(tmp_path, layout, half):
    """Every case of a layout, in two halves (int8's whole sweep was 80 CPU-s: the longest
    test of the suite, its tail on 2 workers)."""
    assert _run(tmp_path, layout, sample=None, part=slice(half, None, 2)) > 50


def test_verify_finds_what_no_read_sees(tmp_path):
    """Damage the newest version's reads never meet, found by verify: an older version's
    shard swapped for the newest's (every unit of a shard ends in its own crc32c, so a
    crc32c pin of the file was the same for both), ``last`` edited, a live file swapped."""
    base = tmp_path / "base"
    _build(base, "sharded", seed=1)
    v = "vectors/.embstore/versions"
    cases = [(f"{v}/1/vectors/c/0/0", (base / f"{v}/3/vectors/c/0/0").read_bytes()),
             ("vectors/.embstore/last",
              (base / "vectors/.embstore/last").read_bytes().replace(b'"pid": ', b'"pid": 1')),
             ("norms/zarr.json", (base / f"{v}/2/norms/zarr.json").read_bytes())]
    for i, (rel, data) in enumerate(cases):
        path = tmp_path / f"case{i}"
        shutil.copytree(base, path, symlinks=True)
        assert (path / rel).read_bytes() != data
        os.remove(path / rel)
        (path / rel).write_bytes(data)
        assert _same(_read(path), _read(base))  # (the newest version reads exactly)
        report = embstore.verify(path)
        assert not report.ok, rel
        assert any(rel.split("/")[-1] in d.message or rel in d.file for d in report.damaged), \
            [d.message for d in report.damaged]
