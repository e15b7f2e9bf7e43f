"""Batch lookup jobs on Dask: a LocalCluster of processes, real `dask scheduler` and workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

import embstore
from embstore.batch import lookup_file
from embstore.cli import cli

pytest.importorskip("dask.distributed")

pytestmark = [pytest.mark.dask, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
DASK = Path(sys.executable).with_name("dask")
V, D = 700, 12
KEYS = [f"k{i}" for i in range(V)]


@pytest.fixture
def table_array(rng):
    return rng.standard_normal((V, D)).astype(np.float32)


@pytest.fixture
def job_files(tmp_path, table_array, rng):
    """A table on disk (a store when the backend exists, else a .npy), ids and a key file."""
    if hasattr(embstore, "save"):
        table = tmp_path / "table"
        embstore.save(table, table_array, keys=KEYS, chunk_rows=32, shard_rows=128).close()
    else:
        table = tmp_path / "table.npy"
        np.save(table, table_array)
    ids = rng.integers(0, V, size=(203, 5))
    np.save(tmp_path / "ids.npy", ids)
    lines = [" ".join(KEYS[j] for j in rng.integers(0, V, size=rng.integers(0, 9)))
             for _ in range(57)]
    (tmp_path / "text.txt").write_text("\n".join(lines) + "\n")
    return str(table), ids


def run_both(runner, table, ids_path, tmp_path, scheduler, exts=("npy", "zarr")):
    """The same job on one machine and on ``scheduler``; returns both outputs' paths."""
    outs = {}
    for name, sched in [("single", None), ("dask", scheduler)]:
        for ext in exts:
            out = tmp_path / f"{name}.{ext}"
            args = ["lookup", table, str(ids_path), str(out), "--batch-rows", "16", "-q"]
            if sched:
                args += ["--scheduler", sched]
            res = runner.invoke(cli, args)
            assert res.exit_code == 0, res.output
            outs[name, ext] = out
    return outs


def assert_same(outs, expected):
    assert outs["dask", "npy"].read_bytes() == outs["single", "npy"].read_bytes()
    np.testing.assert_array_equal(np.load(outs["dask", "npy"]), expected)
    for name in ("single", "dask") if ("dask", "zarr") in outs else ():
        z = zarr.open_array(outs[name, "zarr"], mode="r")
        assert z.chunks[0] == 16
        np.testing.assert_array_equal(z[:], expected)


def test_local_cluster_same_bytes(tmp_path, job_files, table_array):
    table, ids = job_files
    with socket.socket() as blocker:  # Dask's default HTTP port taken must not matter
        try:
            blocker.bind(("127.0.0.1", 8787))
            blocker.listen()
        except OSError:
            pass  # taken already: the same situation
        outs = run_both(CliRunner(), table, tmp_path / "ids.npy", tmp_path, "local",
                        exts=("npy",))
    assert_same(outs, np.take(table_array, ids, axis=0))
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_real_scheduler_and_workers(tmp_path, job_files, table_array):
    from dask.distributed import Client

    table, ids = job_files
    address = f"tcp://127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = []
    try:
        with open(tmp_path / "scheduler.log", "wb") as log:
            procs.append(subprocess.Popen(
                [str(DASK), "scheduler", "--host", "127.0.0.1", "--port",
                 address.rsplit(":", 1)[1], "--no-dashboard", "--dashboard-address",
                 "127.0.0.1:0", "--idle-timeout", "300"],
                stdout=log, stderr=log, env=env, cwd=tmp_path, start_new_session=True))
        with open(tmp_path / "worker.log", "wb") as log:
            procs.append(subprocess.Popen(
                [str(DASK), "worker", address, "--nworkers", "2", "--nthreads", "1",
                 "--host", "127.0.0.1", "--no-dashboard", "--death-timeout", "60",
                 "--local-directory", str(tmp_path / "dask-worker")],
                stdout=log, stderr=log, env=env, cwd=tmp_path, start_new_session=True))
        deadline = time.monotonic() + 60
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=max(1.0, deadline - time.monotonic()))
            assert len(client.scheduler_info()["workers"]) == 2
        runner = CliRunner()
        outs = run_both(runner, table, tmp_path / "ids.npy", tmp_path, address)
        assert_same(outs, np.take(table_array, ids, axis=0))

        if table.endswith(".npy"):
            return  # key jobs need a store with keys
        with embstore.open(table) as opened:  # a Table object: workers open its path
            lookup_file(opened, tmp_path / "ids.npy", tmp_path / "obj.zarr", batch_rows=50,
                        scheduler=address)
        np.testing.assert_array_equal(zarr.open_array(tmp_path / "obj.zarr", mode="r")[:],
                                      table_array[ids])
        summary = lookup_file(table, tmp_path / "text.txt", tmp_path / "k.npy", keys=True,
                              oov="zero", batch_rows=8, scheduler=address,
                              lengths=tmp_path / "len.npy")
        single = lookup_file(table, tmp_path / "text.txt", tmp_path / "k1.npy", keys=True,
                             oov="zero", batch_rows=8)
        assert summary["shape"] == single["shape"] and summary["blocks"] == 8
        assert (tmp_path / "k.npy").read_bytes() == (tmp_path / "k1.npy").read_bytes()
        lines = (tmp_path / "text.txt").read_text().splitlines()
        np.testing.assert_array_equal(np.load(tmp_path / "len.npy"),
                                      [len(line.split()) for line in lines])
        (tmp_path / "bad.txt").write_text("k1 k2\nk3 nope\n")  # raised in a worker
        res = runner.invoke(cli, ["lookup", table, str(tmp_path / "bad.txt"),
                                  str(tmp_path / "bad.zarr"), "--keys", "--scheduler", address])
        assert res.exit_code == 1, res.output
        assert "line 2: key 'nope' (token 2) is not in the table" in res.output
        assert not (tmp_path / "bad.zarr").exists()
    finally:
        for proc in reversed(procs):
            stop(proc)


def test_unreachable_scheduler_is_a_clean_error(tmp_path, job_files, monkeypatch):
    import embstore.batch.dask as batch_dask

    monkeypatch.setattr(batch_dask, "CONNECT_TIMEOUT", 1)
    table, _ = job_files
    res = CliRunner().invoke(cli, ["lookup", table, str(tmp_path / "ids.npy"),
                                   str(tmp_path / "o.npy"), "--scheduler",
                                   f"tcp://127.0.0.1:{free_port()}"])
    assert res.exit_code == 1
    assert res.output.startswith("Error: cannot reach the Dask scheduler at tcp://127.0.0.1:")
    assert not (tmp_path / "o.npy").exists()
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]
