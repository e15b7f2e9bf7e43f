"""format2: what format 2 (rows at a fixed stride, page checksums) changes, against format 1
and against the limits of the memory under it (docs/FORMAT.md §3a).

- A fresh process, page cache warm, looks up (32, 512) uniform ids: embstore format 2 and
  format 1 (no row cache) against ``np.load(mmap_mode="r")[ids]`` in a fresh process.
- Whole-table reads of a freshly opened table, warm: ``verify``, ``to_numpy`` and
  zarr-python's ``arr[:]`` of ``vectors``, format 2 against format 1 and against ``np.load``
  of the same bytes (the copy limit).
"""

from __future__ import annotations

import numpy as np

from .. import data
from ..children import child_method_runs, run_child
from ..common import Measurement, Method, Warmer, absolute, compare, interleave

NAME = "format2"
TITLE = "Format 2 against format 1 and the memory's limits"

V1, V2, MEMMAP = "embstore format 1", "embstore format 2", "np.load(mmap_mode='r')[ids]"


def run(ctx, res) -> None:
    cfg = ctx.cfg["format2"]
    rows, dim, reps = cfg["rows"], cfg["dim"], cfg["reps"]
    res.params = {"rows": rows, "dim": dim, "ids": 32 * 512, "reps": reps}
    npy = data.table_npy(ctx.data_dir, rows, dim)
    one = data.store(ctx.data_dir, npy, layout={"format_version": 1})  # (new tables: 2)
    two = data.store(ctx.data_dir, npy, layout={"format_version": 2})
    ids_npy = data.ids_npy(ctx.data_dir, rows, 32 * 512, "uniform")
    ids = np.load(ids_npy)
    values = np.load(npy, mmap_mode="r")
    expected = float(np.asarray(values[ids.reshape(-1)], dtype=np.float64).sum())
    warmer = Warmer([npy, one, two])

    def check(name, out):
        if abs(out.get("checksum", np.nan) - expected) > 1e-3 * max(1.0, abs(expected)):
            raise AssertionError(f"{name} returned other rows (checksum {out.get('checksum')}, "
                                 f"expected {expected})")

    case = "fresh process, (32, 512) uniform ids, page cache warm"
    runs = {V2: ("embstore", lambda: run_child("fresh-lookup", "embstore", two, ids_npy)),
            V1: ("embstore", lambda: run_child("fresh-lookup", "embstore", one, ids_npy)),
            MEMMAP: ("peer", lambda: run_child("fresh-lookup", "memmap", npy, ids_npy))}
    child_method_runs(res, case, runs, reps=reps, warmer=warmer, check=check)
    f = res.find
    compare(res, "fresh process lookup: format 2 vs the memmap", f(case, V2), f(case, MEMMAP),
            target=("within", 1.5))
    compare(res, "fresh process lookup: format 2 vs format 1", f(case, V2), f(case, V1),
            target=("faster", None))

    import embstore
    import zarr

    def whole(path):
        with embstore.open(path, cache_bytes=0) as t:
            return t.to_numpy()

    def check_rows(out):
        if out.shape != values.shape or not np.array_equal(out[:: max(1, rows // 97)],
                                                           values[:: max(1, rows // 97)]):
            raise AssertionError("other rows")

    scan = "whole table, freshly opened, page cache warm"
    methods = [
        Method(f"{V2} verify", "embstore", lambda: embstore.verify(two), unit="s",
               check=lambda r: None if r.ok else (_ for _ in ()).throw(AssertionError(str(r)))),
        Method(f"{V1} verify", "embstore", lambda: embstore.verify(one), unit="s"),
        Method(f"{V2} to_numpy", "embstore", lambda: whole(two), unit="s", check=check_rows),
        Method(f"{V1} to_numpy", "embstore", lambda: whole(one), unit="s", check=check_rows),
        Method("zarr-python arr[:] of format 2", "peer",
               lambda: zarr.open_array(str(data.vectors_path(two)), mode="r")[:], unit="s",
               check=check_rows),
        Method("zarr-python arr[:] of format 1", "peer",
               lambda: zarr.open_array(str(data.vectors_path(one)), mode="r")[:], unit="s",
               reps=cfg.get("slow_reps", reps), check=check_rows),
        Method("np.load (a copy of the same bytes)", "peer", lambda: np.load(npy), unit="s"),
    ]
    try:
        import tensorstore as ts
        spec = {"driver": "zarr3", "kvstore": {"driver": "file",
                                               "path": str(data.vectors_path(two))}}
        methods.append(Method("tensorstore read() of format 2", "peer",
                              lambda: ts.open(spec, read=True).result().read().result(),
                              unit="s", check=check_rows))
    except ImportError:
        res.notes.append("tensorstore: skipped: not installed")
    found = interleave(res, scan, methods, reps=reps, warmer=warmer)
    compare(res, "tensorstore reading a whole format-2 table vs np.load",
            found.get("tensorstore read() of format 2"), found.get(
                "np.load (a copy of the same bytes)"), target=("within", 2.0))
    _dask_chunks(res, two, values.nbytes)
    _faults(res, [m for m in methods if "format 1" not in m.name and "verify" not in m.name])
    limit = found.get("np.load (a copy of the same bytes)")
    compare(res, "to_numpy: format 2 vs np.load", found.get(f"{V2} to_numpy"), limit,
            target=("within", 1.5))
    compare(res, "verify: format 2 vs np.load", found.get(f"{V2} verify"), limit,
            target=("within", 1.5))
    compare(res, "verify: format 2 vs format 1", found.get(f"{V2} verify"),
            found.get(f"{V1} verify"), target=("faster", None))
    compare(res, "zarr-python reading a whole format-2 table vs np.load",
            found.get("zarr-python arr[:] of format 2"), limit, target=("within", 2.0))
    compare(res, "zarr-python: format 2 vs format 1", found.get("zarr-python arr[:] of format 2"),
            found.get("zarr-python arr[:] of format 1"), target=("faster", None))
    _open_and_one_id(ctx, res, cfg, reps)


def _faults(res, methods) -> None:
    """One more call of each whole-table read, with the page faults it took and its system
    time (a note): what sets the floor of the peers' reads on this machine is their fresh
    memory, faulted in 4 KiB at a time, while ``np.load``'s one array gets 2 MiB pages."""
    import resource

    for m in methods:  # a loop per method (a few)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        out = m.fn()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        del out
        faults = r1.ru_minflt - r0.ru_minflt
        res.notes.append(f"{m.name}: {faults:,} minor page faults ({faults * 4096 / 2**30:.2f} "
                         f"GiB at 4 KiB each), {r1.ru_stime - r0.ru_stime:.2f} s system time "
                         f"in one call")


def _dask_chunks(res, path, nbytes: int) -> None:
    """``xr.open_zarr`` of a format-2 table: its dask chunks of ``vectors`` against the
    bound of one per 64 MiB (a note: a count, not a time)."""
    try:
        import xarray as xr
    except ImportError:
        res.notes.append("xarray: skipped: not installed")
        return
    ds = xr.open_zarr(str(path), consolidated=False)
    chunks = ds["vectors"].data.npartitions
    bound = -(-nbytes // (64 << 20))
    res.notes.append(f"xr.open_zarr: vectors in {chunks} dask chunks for {nbytes / 2**20:.0f} "
                     f"MiB (bound: one per 64 MiB, {bound}): "
                     f"{'met' if chunks <= bound else 'NOT met'}")


def _open_and_one_id(ctx, res, cfg, reps) -> None:
    """Open + the first lookup of one id in a fresh process, page cache warm, at two table
    sizes: the small table above and one of ``big_rows`` x 64 (created as zeros: sparse
    files, so the size costs no disk); the bar is absolute (at most 5 ms) and flat."""
    import embstore
    from pathlib import Path

    big_rows = cfg.get("big_rows", 100_000_000)
    found = {}
    for rows in (cfg["rows"], big_rows):
        path = Path(ctx.data_dir) / f"zeros-{rows}x64-format2.embstore"
        if not path.exists():
            embstore.create(path, (rows, 64)).close()
        one = Path(ctx.data_dir) / f"one-id-of-{rows}.npy"
        np.save(one, np.array([rows - 7], dtype=np.int64))
        case = f"fresh process: open + 1 id of {rows:,} x 64"
        runs = {V2: ("embstore", lambda p=path, o=one: run_child("fresh-lookup", "embstore", p, o))}
        done = child_method_runs(res, case, runs, reps=reps,
                                 check=lambda name, out: None if out.get("checksum") == 0 else (
                                     _ for _ in ()).throw(AssertionError("zeros expected")))
        if done.get(V2):
            m = Measurement(case, f"{V2} (ms)", "embstore", "ms",
                            [d["seconds"] * 1e3 for d in done[V2]])
            res.measurements.append(m)
            found[rows] = m
    for rows, m in found.items():
        absolute(res, f"open + first lookup of one id, {rows:,} rows", m, at_most=5.0)
