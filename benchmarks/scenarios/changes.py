"""changes: tables that change (docs/FORMAT.md §6-7) against stores that change in place.

- **Random updates**: 10,000 random rows of a (rows, dim) float32 table written and made
  durable: embstore format 2 (a delta: one commit, a new version) against ``np.memmap``
  assignment + ``flush`` (not atomic), LMDB (one transaction, a row per key) and Lance
  (``merge_insert`` on an id column); bytes written from ``write_bytes`` of
  ``/proc/self/io``.  Each repetition writes other rows; embstore compacts between
  repetitions (untimed), so each timed write starts from a table without deltas.
- **Appends with keys**: 100,000 rows with string keys appended: embstore format 2 against
  HDF5 (a chunked, resizable dataset plus a keys dataset), LMDB (row and key entries) and
  Lance (``mode="append"``).
- **Lookups over deltas**: (32, 512) uniform ids, warm, on a table with 1% of its rows in
  deltas against the same table compacted.

Peers missing from the environment (``h5py``, ``lmdb``, ``lance``) are skipped with a note.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np

from .. import data
from ..common import (Measurement, Skip, compare, drop_page_cache, log, read_through,
                      written_bytes)

NAME = "changes"
TITLE = "Tables that change: updates, appends and lookups over deltas"

EMB = "embstore format 2"


def _timed(fn) -> tuple[float, int]:
    gc.collect()
    os.sync()
    w0 = written_bytes()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    os.sync()  # (what the call left for the kernel to write counts too)
    return dt, written_bytes() - w0


def _copy_tree(src: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(dest)], check=True)  # links kept


class _Peer:
    """One store under test: ``setup()`` (untimed, once), ``update(ids, rows)``,
    ``append(rows, keys)``, ``close()``."""


class _Embstore(_Peer):
    name = EMB

    def __init__(self, work: Path, npy: Path):
        import embstore
        self.es = embstore
        self.path = work / "t.emb"
        base = data.store(work.parent, npy, layout={"format_version": 2})
        _copy_tree(base, self.path)
        self.t = embstore.open(self.path, "r+")

    def between(self) -> None:
        self.t.compact()  # untimed: each timed write starts without deltas
        self.t.vacuum(keep=1)

    def update(self, ids, rows) -> None:
        self.t.write(ids, rows)

    def append(self, rows, keys) -> None:
        self.t.append(rows, keys=keys)

    def close(self) -> None:
        self.t.close()


class _Memmap(_Peer):
    name = "np.memmap assignment + flush"

    def __init__(self, work: Path, npy: Path):
        self.path = work / "t.npy"
        shutil.copyfile(npy, self.path)
        self.m = np.load(self.path, mmap_mode="r+")

    def between(self) -> None:
        pass

    def update(self, ids, rows) -> None:
        self.m[ids] = rows
        self.m.flush()

    def close(self) -> None:
        del self.m


class _Lmdb(_Peer):
    name = "LMDB (one transaction)"

    def __init__(self, work: Path, npy: Path, *, keys: bool = False):
        try:
            import lmdb
        except ImportError:
            raise Skip("lmdb is not installed") from None
        values = np.load(npy, mmap_mode="r")
        self.env = lmdb.open(str(work / "t.lmdb"), map_size=4 * values.nbytes + (1 << 30),
                             sync=True, writemap=False, max_dbs=2)
        self.rows_db = self.env.open_db(b"rows")
        self.keys_db = self.env.open_db(b"keys")
        step = 65536
        for a in range(0, len(values), step):  # a loop per block (loading the peer)
            block = np.ascontiguousarray(values[a: a + step])
            with self.env.begin(write=True, db=self.rows_db) as txn:
                cur = txn.cursor()
                cur.putmulti([(int(i).to_bytes(8, "big"), block[i - a].tobytes())
                              for i in range(a, a + len(block))], append=True)
        self.n = len(values)

    def between(self) -> None:
        pass

    def update(self, ids, rows) -> None:
        with self.env.begin(write=True, db=self.rows_db) as txn:
            cur = txn.cursor()
            cur.putmulti([(int(i).to_bytes(8, "big"), r.tobytes()) for i, r in zip(ids, rows)])

    def append(self, rows, keys) -> None:
        n0 = self.n
        with self.env.begin(write=True) as txn:
            txn.cursor(db=self.rows_db).putmulti(
                [((n0 + i).to_bytes(8, "big"), r.tobytes()) for i, r in enumerate(rows)],
                append=True)
            txn.cursor(db=self.keys_db).putmulti(
                [(k.encode(), (n0 + i).to_bytes(8, "big")) for i, k in enumerate(keys)])
        self.n += len(rows)

    def close(self) -> None:
        self.env.close()


class _Lance(_Peer):
    name = "Lance (merge_insert / append)"

    def __init__(self, work: Path, npy: Path):
        try:
            import lance
            import pyarrow as pa
        except ImportError:
            raise Skip("pylance is not installed") from None
        self.lance, self.pa = lance, pa
        values = np.load(npy, mmap_mode="r")
        self.dim = values.shape[1]
        self.uri = str(work / "t.lance")
        step = 131072

        def batches():
            for a in range(0, len(values), step):  # a loop per block (loading the peer)
                block = np.ascontiguousarray(values[a: a + step])
                yield self._batch(np.arange(a, a + len(block)), block,
                                  [f"k{i}" for i in range(a, a + len(block))])
        schema = self._batch(np.arange(1), np.zeros((1, self.dim), np.float32), ["x"]).schema
        self.ds = lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()),
                                      self.uri)
        self.n = len(values)

    def _batch(self, ids, rows, keys):
        pa = self.pa
        vec = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(rows).reshape(-1)),
                                                self.dim)
        return pa.RecordBatch.from_arrays([pa.array(ids, pa.int64()), pa.array(keys), vec],
                                          ["id", "key", "vector"])

    def between(self) -> None:
        pass

    def update(self, ids, rows) -> None:
        tbl = self.pa.Table.from_batches([self._batch(ids, rows, [f"k{i}" for i in ids])])
        self.ds.merge_insert("id").when_matched_update_all().execute(tbl)

    def append(self, rows, keys) -> None:
        ids = np.arange(self.n, self.n + len(rows))
        tbl = self.pa.Table.from_batches([self._batch(ids, rows, keys)])
        self.ds = self.lance.write_dataset(tbl, self.uri, mode="append")
        self.n += len(rows)

    def close(self) -> None:
        pass


class _Hdf5(_Peer):
    name = "HDF5 chunked (h5py)"

    def __init__(self, work: Path, npy: Path):
        try:
            import h5py
        except ImportError:
            raise Skip("h5py is not installed") from None
        values = np.load(npy, mmap_mode="r")
        self.f = h5py.File(work / "t.h5", "w")
        rows, dim = values.shape
        self.d = self.f.create_dataset("vectors", shape=(rows, dim), maxshape=(None, dim),
                                       dtype="f4", chunks=(max(1, (1 << 20) // (dim * 4)), dim))
        step = 131072
        for a in range(0, rows, step):  # a loop per block (loading the peer)
            self.d[a: a + step] = values[a: a + step]
        self.k = self.f.create_dataset("keys", shape=(rows,), maxshape=(None,),
                                       dtype=h5py.string_dtype(), chunks=(65536,))
        self.k[:] = np.array([f"k{i}" for i in range(rows)], dtype=object)
        self.f.flush()

    def between(self) -> None:
        pass

    def append(self, rows, keys) -> None:
        n0 = self.d.shape[0]
        self.d.resize(n0 + len(rows), axis=0)
        self.d[n0:] = rows
        self.k.resize(n0 + len(rows), axis=0)
        self.k[n0:] = np.array(keys, dtype=object)
        self.f.flush()
        os.fsync(self.f.id.get_vfd_handle())

    def close(self) -> None:
        self.f.close()


def _measure(res, case, peer, op, reps, make_args) -> Measurement | None:
    times, written = [], []
    for r in range(reps):  # a loop per repetition (each writes other rows)
        args = make_args(r)
        dt, w = _timed(lambda: getattr(peer, op)(*args))
        times.append(dt * 1e3)
        written.append(w / 2**20)
        peer.between()
    m = Measurement(case, peer.name, "embstore" if peer.name == EMB else "peer", "ms",
                    times, {"written_MiB": written})
    res.measurements.append(m)
    log(f"  {case}: {peer.name}: {np.median(times):.1f} ms, {np.median(written):.1f} MiB "
        "written")
    return m


def _make(res, cls, work, npy):
    try:
        return cls(work, npy)
    except Skip as exc:
        res.notes.append(f"{cls.name}: skipped: {exc}")
        return None


def run(ctx, res) -> None:
    cfg = ctx.cfg["changes"]
    rows, dim, reps = cfg["rows"], cfg["dim"], cfg["reps"]
    n_upd, n_app = min(cfg["update_rows"], rows), cfg["append_rows"]
    res.params = {"rows": rows, "dim": dim, "update_rows": n_upd, "append_rows": n_app,
                  "reps": reps}
    npy = data.table_npy(ctx.data_dir, rows, dim)
    work = Path(ctx.data_dir) / "changes-work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    try:
        rng = np.random.default_rng(7)
        upd = [(np.sort(rng.choice(rows, n_upd, replace=False)),
                rng.standard_normal((n_upd, dim), dtype=np.float32)) for _ in range(reps)]
        case = f"{n_upd:,} random rows written, durable"
        found = {}
        for cls in (_Embstore, _Memmap, _Lmdb, _Lance):
            peer = _make(res, cls, work, npy)
            if peer is not None:
                found[peer.name] = _measure(res, case, peer, "update", reps, lambda r: upd[r])
                if peer.name == EMB:  # the rows read back
                    got = peer.t[upd[-1][0]]
                    if not np.array_equal(got, upd[-1][1]):
                        raise AssertionError("embstore: written rows do not read back")
                peer.close()
        f = found.get
        compare(res, "random updates: embstore vs np.memmap + flush", f(EMB),
                f(_Memmap.name), target=("within", 2.0))
        compare(res, "random updates: embstore vs LMDB", f(EMB), f(_Lmdb.name),
                target=("faster", 1.0))
        compare(res, "random updates: embstore vs Lance", f(EMB), f(_Lance.name),
                target=("faster", 1.0))
        emb = f(EMB)
        if emb is not None:
            ratio = float(np.median(emb.extra["written_MiB"])) / (n_upd * dim * 4 / 2**20)
            res.notes.append(f"random updates: embstore wrote {ratio:.2f}x the rows' bytes "
                             "(target <= 2x)")

        case = f"{n_app:,} rows appended with keys, durable"
        app = [(rng.standard_normal((n_app, dim), dtype=np.float32),
                [f"app{r}-{i}" for i in range(n_app)]) for r in range(reps)]
        found = {}
        for cls in (_Embstore, _Hdf5, _Lmdb, _Lance):
            for p in work.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            peer = _make(res, cls, work, npy)
            if peer is not None:
                if isinstance(peer, _Embstore):
                    peer.t.close()  # the base store has no keys: one with keys
                    shutil.rmtree(peer.path)
                    _with_keys(peer, npy)
                found[peer.name] = _measure(res, case, peer, "append", reps, lambda r: app[r])
                peer.close()
        f = found.get
        compare(res, "appends with keys: embstore vs HDF5 chunked", f(EMB), f(_Hdf5.name),
                target=("within", 2.0))
        compare(res, "appends with keys: embstore vs LMDB", f(EMB), f(_Lmdb.name),
                target=("faster", 1.0))
        compare(res, "appends with keys: embstore vs Lance", f(EMB), f(_Lance.name),
                target=("faster", 1.0))
        _lookups_over_deltas(res, work, npy, rows, dim, reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _with_keys(peer: _Embstore, npy: Path) -> None:
    values = np.load(npy, mmap_mode="r")
    peer.es.save(peer.path, values, keys=[f"k{i}" for i in range(len(values))],
                 format_version=2).close()
    peer.t = peer.es.open(peer.path, "r+")


def _lookups_over_deltas(res, work, npy, rows, dim, reps) -> None:
    import embstore
    path = work / "deltas.emb"
    _copy_tree(data.store(work.parent, npy, layout={"format_version": 2}), path)
    rng = np.random.default_rng(11)
    ids = rng.choice(rows, rows // 100, replace=False)
    with embstore.open(path, "r+") as t:
        t.write(ids, rng.standard_normal((ids.size, dim), dtype=np.float32))
        assert t.info()["pending_rows"] == ids.size
    compacted = work / "compacted.emb"
    _copy_tree(path, compacted)
    with embstore.open(compacted, "r+") as t:
        t.compact()
    # both tables' pages read into the page cache the same way (files just written by
    # cp and by a compaction sit in the cache differently: 20% apart in gathers here)
    drop_page_cache([path, compacted])
    read_through([path, compacted])
    case = "(32, 512) uniform ids, warm, 1% of the rows in deltas"
    batches = [rng.integers(0, rows, (32, 512)) for _ in range(8)]
    found = {}
    with embstore.open(path) as a, embstore.open(compacted) as b:
        for name, t in (("embstore, 1% in deltas", a), ("embstore, compacted", b)):
            for q in batches:
                t[q]  # warm: every page of the batches touched once
        times: dict = {"embstore, 1% in deltas": [], "embstore, compacted": []}
        for r in range(max(20, reps * 10)):  # interleaved, a loop per repetition
            q = batches[r % len(batches)]
            for name, t in (("embstore, 1% in deltas", a), ("embstore, compacted", b)):
                t0 = time.perf_counter()
                t[q]
                times[name].append((time.perf_counter() - t0) * 1e3)
        if not np.array_equal(a[batches[0]], b[batches[0]]):
            raise AssertionError("deltas and their compaction read differently")
    for name, v in times.items():
        m = Measurement(case, name, "embstore" if "deltas" in name else "peer", "ms", v)
        res.measurements.append(m)
        found[name] = m
    compare(res, "lookups over 1% deltas vs the compacted table",
            found["embstore, 1% in deltas"], found["embstore, compacted"],
            target=("within", 1.2))
