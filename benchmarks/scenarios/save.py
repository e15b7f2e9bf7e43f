"""save: a new (rows, dim) float32 table with one string key per row, written and made
durable, against the stores a user would write it to instead.

- embstore ``save(path, rows, keys=...)`` (the default: format 2, norms, the key index);
- ``np.save`` + fsync (rows only: no keys, no checksums; the disk's limit);
- HDF5 through h5py: contiguous, and chunked (1 MiB chunks of rows, 65,536 keys a chunk),
  rows plus a variable-length string dataset of the keys;
- Lance ``write_dataset`` (an id, the key and the vector per row, batches of 131,072).

The rows are in RAM before timing (the source's read is not measured); every repetition
writes a new store, timed from the call to the end of an ``os.sync()`` (what the writer
left for the kernel to write counts), bytes from ``write_bytes`` of ``/proc/self/io``.
Peers missing from the environment are skipped with a note.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from pathlib import Path

import numpy as np

from .. import data
from ..common import Measurement, Skip, compare, log, written_bytes

NAME = "save"
TITLE = "Saving a table with keys, durable"

EMB = "embstore save (format 2, keys)"
NPY = "np.save + fsync (no keys)"
H5C = "HDF5 contiguous (h5py)"
H5K = "HDF5 chunked (h5py)"
LANCE = "Lance write_dataset"


def _embstore(path: Path, E: np.ndarray, keys: list[str]) -> None:
    import embstore
    embstore.save(path, E, keys=keys).close()


def _npy(path: Path, E: np.ndarray, keys: list[str]) -> None:
    with open(path.with_suffix(".npy"), "wb") as f:
        np.save(f, E)
        f.flush()
        os.fsync(f.fileno())


def _hdf5(chunked: bool):
    try:
        import h5py
    except ImportError:
        raise Skip("h5py is not installed") from None

    def write(path: Path, E: np.ndarray, keys: list[str]) -> None:
        rows, dim = E.shape
        with h5py.File(path.with_suffix(".h5"), "w") as f:
            kw = {"chunks": (min(rows, max(1, (1 << 20) // (dim * 4))), dim)} if chunked else {}
            f.create_dataset("vectors", data=E, **kw)
            f.create_dataset("keys", data=np.array(keys, dtype=object),
                             dtype=h5py.string_dtype(), **({"chunks": (min(rows, 65536),)} if chunked
                                                           else {}))
            f.flush()
            os.fsync(f.id.get_vfd_handle())
    return write


def _lance():
    try:
        import lance
        import pyarrow as pa
    except ImportError:
        raise Skip("pylance is not installed") from None

    def write(path: Path, E: np.ndarray, keys: list[str]) -> None:
        rows, dim = E.shape
        step = 131072

        def batch(a: int):
            b = min(rows, a + step)
            vec = pa.FixedSizeListArray.from_arrays(pa.array(E[a:b].reshape(-1)), dim)
            return pa.RecordBatch.from_arrays(
                [pa.array(np.arange(a, b), pa.int64()), pa.array(keys[a:b]), vec],
                ["id", "key", "vector"])
        first = batch(0)
        reader = pa.RecordBatchReader.from_batches(
            first.schema, (batch(a) for a in range(0, rows, step)))
        lance.write_dataset(reader, str(path.with_suffix(".lance")))
    return write


def _measure(res, case: str, name: str, kind: str, fn, work: Path, E, keys, reps: int):
    times, written = [], []
    for r in range(reps):  # a loop per repetition (each a new store)
        dest = work / f"r{r}"
        gc.collect()
        os.sync()
        w0, t0 = written_bytes(), time.perf_counter()
        fn(dest, E, keys)
        os.sync()
        times.append(time.perf_counter() - t0)
        written.append((written_bytes() - w0) / 2**20)
        for p in work.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    m = Measurement(case, name, kind, "s", times, {"written_MiB": written,
                                                   "MB_per_s": E.nbytes / 1e6 / min(times)})
    res.measurements.append(m)
    log(f"  {name}: {np.median(times):.2f} s, {np.median(written):.0f} MiB written")
    return m


def run(ctx, res) -> None:
    cfg = ctx.cfg["save"]
    rows, dim, reps = cfg["rows"], cfg["dim"], cfg["reps"]
    res.params = {"rows": rows, "dim": dim, "dtype": "float32", "keys": rows, "reps": reps}
    E = data.load_in_ram(data.table_npy(ctx.data_dir, rows, dim))
    keys = [f"k{i}" for i in range(rows)]
    case = f"{rows:,} x {dim} float32 with {rows:,} keys"
    work = Path(ctx.data_dir) / "save-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    found: dict[str, Measurement] = {}
    try:
        for name, kind, make in ((EMB, "embstore", lambda: _embstore),
                                 (NPY, "limit", lambda: _npy),
                                 (H5C, "peer", lambda: _hdf5(False)),
                                 (H5K, "peer", lambda: _hdf5(True)),
                                 (LANCE, "peer", _lance)):
            try:
                fn = make()
            except Skip as exc:
                res.notes.append(f"{name}: skipped: {exc}")
                continue
            found[name] = _measure(res, case, name, kind, fn, work, E, keys, reps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    f = found.get
    compare(res, "save with keys: embstore vs Lance", f(EMB), f(LANCE), target=("faster", 1.0))
    compare(res, "save with keys: embstore vs HDF5 chunked", f(EMB), f(H5K),
            target=("within", 1.5))
    compare(res, "save with keys: embstore vs HDF5 contiguous", f(EMB), f(H5C))
    compare(res, "save: embstore (with keys) vs np.save (rows only)", f(EMB), f(NPY))
