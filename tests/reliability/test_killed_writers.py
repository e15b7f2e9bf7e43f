"""Writers killed with SIGKILL at random points: ``embstore import`` and ``embstore.save``.

After each kill: DEST is absent, or (replacing with ``--overwrite``/``overwrite=True``) DEST
is exactly the old table or exactly the new one, checked value by value, never a mix; a
``DEST.old-*`` left by a kill between the two renames holds the old table whole.  Then a
fresh import to the same DEST succeeds despite the temp leftovers.  ``EMBSTORE_KILL_POINTS``
sets the kill points per scenario (default 4).
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from relhelpers import KILL_POINTS, TRIED

import embstore
import forked
from embstore.errors import EmbstoreError

ROWS, DIM = 6000, 16


def _values(version: int) -> np.ndarray:
    """Row i holds i + version * 0.5 in column 0 (and a fixed pattern elsewhere)."""
    a = np.tile(np.arange(DIM, dtype=np.float32) / 1024, (ROWS, 1))
    a[:, 0] = np.arange(ROWS, dtype=np.float32) + version * 0.5
    return a


def _write_text(path: Path, arr: np.ndarray) -> None:
    lines = [f"{len(arr)} {arr.shape[1]}"]
    lines += [f"w{i} " + " ".join(repr(float(v)) for v in row) for i, row in enumerate(arr)]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("sources")
    out = {}
    for v in (1, 2):
        arr = _values(v)
        np.save(d / f"v{v}.npy", arr)
        _write_text(d / f"v{v}.txt", arr)
        out[v] = (d / f"v{v}.npy", d / f"v{v}.txt")
    return out


def _spawn(code: str, args: list) -> forked.Child:
    """``python -c code args`` as a process forked from tests/forked.py's server (numpy and
    embstore imported: the random moments fall in the writer's work, not its imports)."""
    return forked.start(code, *args)


_CLI = "import sys; from embstore.cli import cli; cli(sys.argv[1:], prog_name='embstore')"
_SAVE = ("import sys, numpy as np, embstore\n"
         "a = np.load(sys.argv[1])\n"
         "for _ in range(3):  # three saves in a row: more moments to be killed in\n"
         "    embstore.save(sys.argv[2], a, keys=[f'w{i}' for i in range(len(a))],\n"
         "                  chunk_rows=64, shard_rows=512, overwrite=True).close()\n")


def _state(dest: Path) -> int | None:
    """None if DEST is absent, else the version (1 or 2) it holds whole; fails on a mix."""
    if not os.path.lexists(dest):
        return None
    with embstore.open(dest) as t:
        got = t.to_numpy()
        keys = list(t.keys) if t.keys is not None else None
    assert got.shape == (ROWS, DIM), f"{dest}: shape {got.shape}"
    version = int(round((got[0, 0]) * 2))
    assert version in (1, 2), got[0]
    np.testing.assert_array_equal(got, _values(version), err_msg=f"{dest}: a mixed table")
    assert keys is None or keys == [f"w{i}" for i in range(ROWS)]
    assert embstore.verify(dest).ok
    return version


def _leftovers(d: Path, dest: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith(dest.name + ".") or
                  n.startswith("." + dest.name))


def _kill_at_random(proc: forked.Child, rng: random.Random, horizon: float) -> bool:
    """SIGKILL after a random delay in [0.2, 1.05) x horizon (the run's whole time);
    True if it was still running."""
    time.sleep(rng.uniform(0.2 * horizon, 1.05 * horizon))
    alive = proc.poll() is None
    if alive:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return alive


def _horizon(code: str, args: list) -> float:
    t0 = time.monotonic()
    p = _spawn(code, args)
    p.wait(timeout=120)
    assert p.returncode == 0, p.stderr.read()
    return time.monotonic() - t0


@pytest.mark.parametrize("fmt", ["npy", "word2vec"])
def test_import_killed_fresh_dest(tmp_path, sources, fmt):
    """A killed import into a new DEST leaves no DEST that opens; a rerun succeeds."""
    src = sources[2][0 if fmt == "npy" else 1]
    dest = tmp_path / "dest"
    horizon = _horizon(_CLI, ["import", src, tmp_path / "probe", "-q"])
    rng = random.Random(f"fresh-{fmt}")
    for _ in range(KILL_POINTS):
        p = _spawn(_CLI, ["import", src, dest, "-q", "--chunk-rows", "64", "--shard-rows", "512"])
        _kill_at_random(p, rng, horizon)
        TRIED[f"kill: import {fmt} (fresh DEST)"] += 1
        state = _state(dest)
        if any(".tmp-" in n for n in _leftovers(tmp_path, dest)):
            TRIED[f"kill: import {fmt} (fresh DEST), temp left"] += 1
        assert state in (None, 2)
        if state is not None:  # finished before the kill: start over
            embstore_rm(dest)
    # the leftovers of killed runs do not stop a fresh import to the same DEST
    p = _spawn(_CLI, ["import", src, dest, "-q"])
    assert p.wait(timeout=120) == 0, p.stderr.read()
    assert _state(dest) == 2


def embstore_rm(path: Path) -> None:
    import shutil
    shutil.rmtree(path)


@pytest.mark.parametrize("writer", ["import", "save"])
@pytest.mark.slow  # 10-60 s under load on 2 cores (2026-12-02 timings)
def test_overwrite_killed_keeps_old_or_new(tmp_path, sources, writer):
    """Replacing v1 by v2 with overwrite, killed at random: DEST is v1 or v2 whole."""
    dest = tmp_path / "dest"
    v1_npy, _ = sources[1]
    v2_npy, _ = sources[2]
    if writer == "import":
        code, args = _CLI, ["import", v2_npy, dest, "-q", "--overwrite", "--chunk-rows", "64",
                            "--shard-rows", "512"]
    else:
        code, args = _SAVE, [v2_npy, dest]
    probe_args = [a if a != dest else tmp_path / "probe" for a in args]
    horizon = _horizon(code, probe_args)
    rng = random.Random(f"overwrite-{writer}")
    seen = {1: 0, 2: 0, None: 0}
    for _ in range(KILL_POINTS * 2):
        if _state(dest) != 1:
            if os.path.lexists(dest):
                embstore_rm(dest)
            embstore.save(dest, np.load(v1_npy), keys=[f"w{i}" for i in range(ROWS)],
                          chunk_rows=64, shard_rows=512).close()
        p = _spawn(code, args)
        _kill_at_random(p, rng, horizon)
        TRIED[f"kill: {writer} --overwrite"] += 1
        state = _state(dest)
        seen[state] += 1
        TRIED[f"kill: {writer} --overwrite, DEST {'old' if state == 1 else state or 'aside'}"] += 1
        if state is None:  # killed between the two renames: the old table is set aside whole
            aside = [n for n in _leftovers(tmp_path, dest) if ".old-" in n]
            assert aside, f"DEST vanished and no old copy: {os.listdir(tmp_path)}"
            assert _state(tmp_path / aside[0]) in (1, 2)
        for name in _leftovers(tmp_path, dest):  # temp dirs never open as the table
            if ".tmp-" in name:
                try:
                    with embstore.open(tmp_path / name) as t:
                        assert t.vocab_size in (0, ROWS)
                except EmbstoreError:
                    pass
    # a later import to the same DEST works despite leftovers
    p = _spawn(_CLI, ["import", v2_npy, dest, "-q", "--overwrite"])
    assert p.wait(timeout=120) == 0, p.stderr.read()
    assert _state(dest) == 2
    assert seen[1] + seen[2] + seen[None] == KILL_POINTS * 2


def test_save_killed_fresh_dest(tmp_path, sources):
    v2_npy, _ = sources[2]
    dest = tmp_path / "dest"
    horizon = _horizon(_SAVE, [v2_npy, tmp_path / "probe"])
    rng = random.Random("save-fresh")
    for _ in range(KILL_POINTS):
        p = _spawn(_SAVE, [v2_npy, dest])
        _kill_at_random(p, rng, horizon / 3)
        TRIED["kill: save (fresh DEST)"] += 1
        assert _state(dest) in (None, 2)
        if os.path.lexists(dest):
            embstore_rm(dest)
    embstore.save(dest, np.load(v2_npy), keys=[f"w{i}" for i in range(ROWS)]).close()
    assert _state(dest) == 2
