"""Hostile use of the Python API: array subclasses as ids, huge results, memory of the row
cache, closed tables, and tables used across fork (as a PyTorch DataLoader does)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading

import numpy as np
import pytest

import embstore
from embstore.cache.rows import RowCache, parse_bytes
from embstore.cache.null import make_cache
from embstore.errors import (ClosedTableError, InvalidIdError, InvalidOptionError,
                             ReadOnlyError, ResultTooLargeError)

E = np.arange(200 * 6, dtype=np.float32).reshape(200, 6) / 7
KEYS = [f"k{i}" for i in range(200)]


@pytest.fixture
def alarm():
    """Fail instead of hanging: SIGALRM interrupts a blocked call in the main thread."""
    def boom(*_):
        raise TimeoutError("hung")

    old = signal.signal(signal.SIGALRM, boom)
    yield lambda s: signal.alarm(s)
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(params=["memory", "zarr-cache", "zarr-nocache", "zarr-zstd"])
def table(request, tmp_path):
    if request.param == "memory":
        t = embstore.MemoryTable(E.copy(), keys=KEYS)
    else:
        kw = {"compression": "zstd"} if request.param == "zarr-zstd" else {}
        embstore.save(tmp_path / "t", E, keys=KEYS, chunk_rows=8, shard_rows=32, **kw).close()
        t = embstore.open(tmp_path / "t", mode="r+",
                          cache_bytes=0 if request.param == "zarr-nocache" else "1MiB")
    yield t
    t.close()


# -- ids ------------------------------------------------------------------------------------
def test_masked_ids_are_refused_not_wrapped(table):
    ids = np.ma.array([5, -3, 7], mask=[False, True, False])  # min()/max() skip -3
    with pytest.raises(InvalidIdError, match=r"masked .* position \(1,\)"):
        table.lookup(ids)
    with pytest.raises(InvalidIdError, match="masked"):
        table[np.ma.array([[1, 2]], mask=[[False, True]])]


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_unmasked_masked_array_and_matrix_are_plain_ids(table):
    got = table.lookup(np.ma.array([5, 9, 5]))
    np.testing.assert_array_equal(got, E[[5, 9, 5]])
    assert type(got) is np.ndarray
    m = np.matrix([[1, 2, 3], [4, 5, 199]])
    got = table.lookup(m)
    assert type(got) is np.ndarray and got.shape == (2, 3, 6)
    np.testing.assert_array_equal(got, E[np.asarray(m)])
    again = table.lookup(m)  # now from the row cache: the same
    np.testing.assert_array_equal(again, got)


def test_a_result_larger_than_memory_fails_before_scanning(table, alarm):
    ids = np.broadcast_to(np.int64(0), (1 << 40,))
    alarm(20)  # scanning 2**40 ids took 90 s
    with pytest.raises(ResultTooLargeError, match="more than this machine's") as err:
        table.lookup(ids)
    assert isinstance(err.value, MemoryError) and isinstance(err.value, embstore.EmbstoreError)


# -- the row cache --------------------------------------------------------------------------
def test_cache_of_a_small_table_is_sized_by_the_table(tmp_path):
    embstore.save(tmp_path / "t", E).close()
    with embstore.open(tmp_path / "t", cache_bytes="256MiB") as t:  # 256 MiB asked for
        t.lookup(np.arange(200))
        t.lookup(np.arange(200))
        c = t._cache
        assert c.slots <= 200
        held = sum(a.nbytes for a in (c._rows, c._slot_id, c._stamp, c._hk, c._hv, c._seen))
        assert held <= 64 << 10, held  # was 143 MB for a 128 KB table
        assert t.cache_info().entries == 200


def test_cache_grows_on_use_and_stays_exact():
    rng = np.random.default_rng(3)
    table = rng.standard_normal((50_000, 4)).astype(np.float32)

    def fetch(ids, out):
        out[:] = table[ids]

    c = RowCache(256 << 20, 4, np.float32)  # a budget of 16M rows, no table size given
    c.gather(np.arange(10), None, fetch)
    assert c._rows.shape[0] <= 4096 and c._hk.size <= 16384  # nothing sized by the budget
    for _ in range(6):
        ids = rng.integers(0, 50_000, 20_000)
        np.testing.assert_array_equal(c.gather(ids, None, fetch), table[ids])
        np.testing.assert_array_equal(c.gather(ids[:3000], None, fetch), table[ids[:3000]])
    assert c._rows.shape[0] >= c.info().entries > 4096


def test_cache_after_append_covers_the_new_rows(tmp_path):
    embstore.save(tmp_path / "t", E[:10]).close()
    with embstore.open(tmp_path / "t", mode="r+", cache_bytes="256MiB") as t:
        t.append(E[10:])
        for _ in range(2):
            np.testing.assert_array_equal(t.lookup(np.arange(200)), E)
        assert t.cache_info().entries == 200


@pytest.mark.parametrize("bad", ["1XB", -5, "-5", 10**30, "1e30", 1.5, True, "nan"])
def test_bad_cache_bytes_is_an_embstore_error(tmp_path, bad):
    embstore.save(tmp_path / "t", E).close()
    with pytest.raises(InvalidOptionError) as err:
        embstore.open(tmp_path / "t", cache_bytes=bad)
    assert isinstance(err.value, ValueError) and isinstance(err.value, embstore.EmbstoreError)


def test_a_huge_budget_is_capped_by_the_table(tmp_path):
    embstore.save(tmp_path / "t", E).close()
    with embstore.open(tmp_path / "t", cache_bytes=1 << 60) as t:
        np.testing.assert_array_equal(t.lookup([3, 3, 4]), E[[3, 3, 4]])
        assert t._cache.slots == 200
    assert parse_bytes(1 << 62) == 1 << 62
    assert isinstance(make_cache(1 << 62, 6, np.float32, rows=5), RowCache)


# -- closed tables --------------------------------------------------------------------------
CALLS = {
    "lookup": lambda t: t.lookup([1]),
    "getitem": lambda t: t[1],
    "slice": lambda t: t[0:3],
    "call": lambda t: t([1]),
    "ids_of": lambda t: t.ids_of(["k1"]),
    "lookup_keys": lambda t: t.lookup_keys(["k1"]),
    "keys": lambda t: t.keys,
    "write": lambda t: t.write([1], E[:1]),
    "append": lambda t: t.append(E[:1], keys=["new"]),
    "to_numpy": lambda t: t.to_numpy(),
    "iter_blocks": lambda t: next(t.iter_blocks(10)),
}


@pytest.mark.parametrize("call", list(CALLS), ids=list(CALLS))
def test_every_method_of_a_closed_table_raises_the_same_error(table, call):
    table.close()
    with pytest.raises(ClosedTableError, match="is closed") as err:
        CALLS[call](table)
    assert not isinstance(err.value, ReadOnlyError)  # a closed r+ table is not read-only
    table.close()  # twice is fine
    assert table.cache_info() is not None


def test_closed_table_key_lookups_open_no_files(tmp_path):
    embstore.save(tmp_path / "t", E, keys=KEYS).close()
    t = embstore.open(tmp_path / "t")
    keys = t.keys
    assert t.ids_of(["k7"]).tolist() == [7]
    t.close()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(ClosedTableError):
            t.ids_of(["k7"])
        with pytest.raises(ClosedTableError):
            keys[3]  # a key sequence taken before close
    assert len(os.listdir("/proc/self/fd")) == before


# -- fork -----------------------------------------------------------------------------------
def _child_lookup(path, ids, q):
    with embstore.open(path) as t:
        q.put(t.lookup(ids))


def _inherited_lookup(t, ids, q):
    q.put(t.lookup(ids))


def _zstd_table(tmp_path):
    path = tmp_path / "z"
    big = np.random.default_rng(1).standard_normal((4096, 16)).astype(np.float32)
    embstore.save(path, big, chunk_rows=16, shard_rows=512, compression="zstd").close()
    return path, big


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_compressed_table_in_a_child_process(tmp_path, method):
    path, big = _zstd_table(tmp_path)
    ids = np.arange(0, 4096, 7)
    t = embstore.open(path)
    np.testing.assert_array_equal(t.lookup(ids), big[ids])  # the parent's pool is started
    ctx = mp.get_context(method)
    q = ctx.Queue()
    target, args = ((_inherited_lookup, (t, ids[::-1], q)) if method == "fork"
                    else (_child_lookup, (str(path), ids[::-1], q)))
    p = ctx.Process(target=target, args=args)
    p.start()
    try:
        got = q.get(timeout=120)  # a forked child hung forever on the copied pool
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()
    np.testing.assert_array_equal(got, big[ids[::-1]])
    t.close()


def test_fork_while_another_thread_holds_the_cache_lock(tmp_path):
    path, big = _zstd_table(tmp_path)
    t = embstore.open(path)
    t.lookup([1, 2, 3])
    held, release = threading.Event(), threading.Event()

    def hold():  # as a thread inside a lookup at the moment of the fork
        with t._cache._lock, t._source.reader._lock:
            held.set()
            release.wait(60)

    th = threading.Thread(target=hold)
    th.start()
    held.wait(10)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: look up, report, leave
        try:
            os.close(r)
            rows = t.lookup(np.arange(0, 4096, 5))
            ok = np.array_equal(rows, big[::5])
            os.write(w, b"ok" if ok else b"bad")
        finally:
            os._exit(0)
    os.close(w)
    release.set()
    th.join()
    import select
    ready, _, _ = select.select([r], [], [], 60)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    out = os.read(r, 10) if ready else b"hung"
    os.close(r)
    t.close()
    assert out == b"ok"


def test_torch_dataloader_workers(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    path, big = _zstd_table(tmp_path)
    t = embstore.open(path)
    t.lookup(np.arange(100))  # used in the parent first, as a training script does

    class Rows(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.from_numpy(t.lookup(np.arange(i, 4096, 64)))

    loader = DataLoader(Rows(), batch_size=8, num_workers=2, timeout=120)
    got = torch.cat(list(loader)).numpy()
    want = np.stack([big[np.arange(i, 4096, 64)] for i in range(64)])
    np.testing.assert_array_equal(got, want)
    t.close()
