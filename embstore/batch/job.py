"""Offline batch lookup jobs: a file of ids (or tokenised text) in, a file of vectors out.

``lookup_file(table, input, output)`` streams the input block by block along
its leading axis: each block of ids is read (memory-mapped ``.npy``, or lines of
a key file), looked up in the table (which reads each needed chunk once and
keeps a row cache) and written to its place in the output (a ``.npy`` file or
a Zarr v3 array chunked by block).  Neither the input nor the output is ever
held in memory whole.  On one machine a small thread pipeline overlaps reading
the next block and writing the previous one with the lookup of the current
one; with ``scheduler=`` every block is a Dask task run by a worker that opens
the table by path and writes its own part of the output.

The output is written beside ``output`` and renamed into place when complete.
A Zarr output records each finished block, so a killed job re-run with
``resume=True`` only computes the blocks that are missing.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .dask import run_dask
from .parquet import is_parquet, lookup_parquet
from .io import (DEFAULT_CACHE_BYTES, FilledIds, Job, KeyLines, NpyIds, NpySink, ZarrSink, lookup_into,
                 open_sink, open_source, open_table, output_kind, read_block, table_location)
from .._types import Bytes, PathLike
from ..fs.atomic import check_dest, remove, replace, temp_path
from ..cache.hotfile import hot_ids
from ..errors import (DestinationExistsError, EmbstoreError, InvalidOptionError,
                      KeyNotFoundError, table_label)
from ..ids import as_ids, one_of, positive_int
from ..oov import KEY_OOV_MODES, OOV
from .remote import RemoteNpyIds, RemoteZarrSink, check_remote_output, is_url, remote_stamp
from ..optional import require
from ..progress import Progress, Tally
from ..table import Table

__all__ = ["lookup_file", "open_table", "DEFAULT_BLOCK_BYTES", "DEFAULT_CACHE_BYTES"]

DEFAULT_BLOCK_BYTES = 16 << 20  # output bytes per block when batch_rows is not given


def _auto_rows(shape: tuple[int, ...], dim: int, itemsize: int) -> int:
    inner = int(np.prod(shape[1:], dtype=np.int64)) if shape else 1
    ids_per_block = max(1, DEFAULT_BLOCK_BYTES // max(1, dim * itemsize))
    return max(1, ids_per_block // max(1, inner))


def _starts(rows: int, batch_rows: int) -> tuple[int, ...]:
    return tuple(range(0, rows, batch_rows)) + (rows,) if rows else (0,)


def _tmp_path(output: str, kind: str) -> str:
    """Where the output is written: a Zarr job under a fixed name (``.<name>.partial``) that a
    re-run finds and resumes; anything else under :func:`embstore.fs.atomic.temp_path`."""
    if kind != "zarr":
        return temp_path(output)
    parent, name = os.path.split(os.path.abspath(output.rstrip("/\\")))
    return os.path.join(parent, f".{name}.partial")


def lookup_file(table: Table | PathLike, input: PathLike, output: PathLike, *,
                keys: bool = False, oov: OOV = "error", unk_id: int | None = None,
                batch_rows: int | None = None, scheduler: str | None = None,
                overwrite: bool = False, resume: bool = False, lengths: PathLike | None = None,
                cache_bytes: Bytes = DEFAULT_CACHE_BYTES, n_workers: int = 2,
                threads: bool = True, on_progress: Progress | None = None,
                column: str | None = None, keep=(), warm=None) -> dict:
    """Look up every id of ``input`` in ``table`` and write the vectors to ``output``.

    ``table`` is a :class:`Table` or a path (a store, or a 2-D ``.npy``); with a
    ``scheduler`` it must be a path the workers can open.  ``input`` is a
    ``.npy`` of integer ids of any shape or, with ``keys=True``, a text file of
    whitespace-separated keys, one sequence a line (output shape ``(lines,
    longest line, dim)``; padding positions are zero rows; ``lengths`` names a
    ``.npy`` file to receive each line's length).  Unknown keys and
    out-of-range ids follow ``oov``: ``"error"`` (naming the first one and its
    position), ``"zero"`` (zero rows), ``"unk"`` (row ``unk_id``) or, for keys of a
    table with a fastText n-gram matrix, ``"subword"`` (composed from the key's
    character n-grams, as ``lookup_keys``).  ``output``
    ends in ``.npy`` or ``.zarr``; its shape is ``ids.shape + (dim,)``.

    ``batch_rows`` is the number of leading rows of the input per block (by
    default about 16 MiB of output).  ``scheduler`` is ``"local"`` (a
    ``LocalCluster`` of ``n_workers`` processes) or a Dask scheduler address.
    ``resume=True`` (Zarr output) continues a killed job from its finished blocks.
    ``threads=False`` turns the read/lookup/write pipeline off.  ``on_progress(done,
    total)`` counts leading rows of the input as their blocks are written.

    Returns a summary dict: ``output``, ``shape``, ``dtype``, ``ids``, ``blocks``,
    ``resumed_blocks``, ``seconds``, ``scheduler``, ``lengths``.

    A Parquet ``input`` (``.parquet``) reads ids or keys (or lists of them) from
    ``column`` and writes a Parquet ``output`` with the vectors and the input columns
    named in ``keep``; see :mod:`embstore.batch.parquet` (on Dask the output is a
    directory of part files).

    ``warm``: the hot rows, loaded into the table's row cache before the first block and
    held there (:meth:`Table.warm`): a hot file (:mod:`embstore.cache.hotfile`: ids
    hottest first, a sample of traffic, or ``(id, count)`` rows; ``.npy`` or text) or an
    array of ids.  It needs a row cache (``cache_bytes``; ``"auto"`` gives an uncompressed
    local store none) and a job run here (no ``scheduler``).  The summary then has
    ``warmed_rows``.
    """
    if warm is not None:
        if scheduler is not None:
            raise InvalidOptionError("warm= loads the row cache of this process's table; "
                                     "with a scheduler the workers open their own: run "
                                     "without one")
        return _lookup_warmed(table, input, output, warm, keys=keys, oov=oov, unk_id=unk_id,
                              batch_rows=batch_rows, overwrite=overwrite, resume=resume,
                              lengths=lengths, cache_bytes=cache_bytes, threads=threads,
                              on_progress=on_progress, column=column, keep=keep)
    if oov == "subword" and (is_parquet(input) or not keys):
        raise ValueError("oov='subword' composes vectors of unknown keys: it needs keys=True "
                         "and a text input (not ids, not Parquet)")
    if is_parquet(input):
        return _parquet(table, input, output, column=column, keep=keep, oov=oov,
                        unk_id=unk_id, batch_rows=batch_rows, scheduler=scheduler,
                        overwrite=overwrite, resume=resume, lengths=lengths,
                        cache_bytes=cache_bytes, n_workers=n_workers, on_progress=on_progress)
    if column is not None or keep:
        raise ValueError("column= and keep= are for Parquet inputs (.parquet)")
    t0 = time.perf_counter()
    input, output = os.fspath(input), os.fspath(output)
    lengths = None if lengths is None else os.fspath(lengths)
    batch_rows, kind = _check_job(input, output, lengths, keys=keys, oov=oov,
                                  batch_rows=batch_rows, resume=resume, scheduler=scheduler,
                                  overwrite=overwrite)
    tab, table_path, owned = _job_table(table, scheduler, cache_bytes)
    try:
        return _run(tab, table_path, input, output, kind, keys=keys, oov=oov, unk_id=unk_id,
                    batch_rows=batch_rows, scheduler=scheduler, overwrite=overwrite,
                    resume=resume, lengths=lengths, on_progress=on_progress,
                    cache_bytes=cache_bytes, n_workers=n_workers, threads=threads, t0=t0)
    finally:
        if owned:
            tab.close()


def _lookup_warmed(table: Table | PathLike, input, output, warm, *, cache_bytes,
                   **options) -> dict:
    """:func:`lookup_file` run here with the hot rows ``warm`` loaded first into the table's
    row cache (a table given by path is opened for the job); the summary counts them."""
    if not isinstance(table, Table):
        with open_table(table_location(table), cache_bytes=cache_bytes) as tab:
            return _lookup_warmed(tab, input, output, warm, cache_bytes=cache_bytes, **options)
    held = _warm(table, warm, cache_bytes)
    summary = lookup_file(table, input, output, cache_bytes=cache_bytes, **options)
    return {**summary, "warmed_rows": held}


def _check_job(input: str, output: str, lengths: str | None, *, keys: bool, oov: OOV,
               batch_rows: int | None, resume: bool, scheduler: str | None,
               overwrite: bool) -> tuple[int | None, str]:
    """The options of an ids or key-file job checked, its outputs free to write and its
    input there, before anything is read or written; ``(batch_rows, output kind)``."""
    one_of(oov, "oov", KEY_OOV_MODES)
    if lengths is not None and not keys:
        raise ValueError("lengths= needs keys=True (a key file has lines of different lengths)")
    if batch_rows is not None:
        batch_rows = positive_int(batch_rows, "batch_rows")
    kind = output_kind(output)
    if resume and kind != "zarr":
        raise ValueError("resume=True needs a Zarr output (.zarr): a .npy job restarts")
    if scheduler is not None:  # before anything is written
        require("dask.distributed", extra="dask", feature="running a batch job on a Dask "
                "scheduler")
    if is_url(output):  # on object storage: a Zarr array, written without rename
        check_remote_output(output, kind)
        RemoteZarrSink.check_dest(output, overwrite or resume)
    else:  # resume over a complete output: nothing to do (checked against the job in _run)
        check_dest(output, overwrite or (resume and os.path.isdir(output)))
    if lengths is not None:
        check_dest(lengths, overwrite or (resume and os.path.isdir(output)))
    if not is_url(input) and not os.path.exists(input):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), input)
    return batch_rows, kind


def _job_table(table: Table | PathLike, scheduler: str | None,
               cache_bytes: Bytes) -> tuple[Table, str | None, bool]:
    """``(table, its path or None, whether the job opened it and closes it)``: a path is
    opened here; an open table given to a Dask job must have a path its workers can open."""
    if isinstance(table, Table):
        if scheduler is not None and table.path is None:
            raise ValueError("a Dask job needs a table on disk: pass its path")
        return table, None if table.path is None else os.fspath(table.path), False
    table_path = table_location(table)
    return open_table(table_path, cache_bytes=cache_bytes), os.fspath(table_path), True


def _warm(tab: Table, warm, cache_bytes) -> int:
    """Load the hot rows ``warm`` (a hot file or ids) into ``tab``'s row cache."""
    if tab.cache_info().capacity_bytes == 0:
        raise InvalidOptionError(
            f"warm= needs a row cache, and {table_label(tab)} has none with cache_bytes="
            f"{str(cache_bytes)!r} ('auto' gives an uncompressed local store none); give it "
            "one, e.g. cache_bytes='2GiB'")
    if isinstance(warm, (str, os.PathLike)):
        warm = hot_ids(warm, tab.vocab_size)
    return tab.warm(warm)


def _parquet(table, input, output, *, column, keep, scheduler, resume, lengths,
             **options) -> dict:
    for name, value in (("resume", resume), ("lengths", lengths)):
        if value:
            raise ValueError(f"{name}= is not supported for Parquet inputs")
    return lookup_parquet(table, input, output, column=column, keep=keep, scheduler=scheduler,
                          **options)


def _plan(tab: Table, table_path, input, kind, *, keys, oov, unk_id, batch_rows, cache_bytes):
    """The job's geometry and blocks; validates the whole input first (ids, or key lines)."""
    dim, dtype = tab.dim, np.dtype(tab.dtype)
    line_lengths = None
    if keys:
        if tab.keys is None:
            raise KeyNotFoundError(f"{table_path or 'the table'} has no keys: keys=True needs a "
                                   "table with keys", key=None, position=None)
        if oov == "subword" and tab.subwords is None:
            raise InvalidOptionError(f"oov='subword' needs a table with subword n-grams "
                                     f"(imported from a fastText .bin); {table_label(tab)} has none")
        line_lengths, line_bytes = KeyLines(input).scan(65536)
        shape = (len(line_lengths), int(line_lengths.max()) if len(line_lengths) else 0)
        rows_per_block = batch_rows or _auto_rows(shape, dim, dtype.itemsize)
        starts = _starts(shape[0], int(rows_per_block))
        ends = np.concatenate([[0], np.cumsum(line_bytes)])
        offsets = tuple(int(ends[a]) for a in starts[:-1])
    else:
        src = RemoteNpyIds(input) if is_url(input) else NpyIds(input)
        shape = tuple(src.shape)
        rows_per_block = batch_rows or _auto_rows(shape, dim, dtype.itemsize)
        starts = _starts(shape[0] if shape else 1, int(rows_per_block))
        if oov == "error":
            src.validate(tab.vocab_size, starts)
        offsets = ()
    if oov == "unk":
        if unk_id is None:
            raise ValueError("oov='unk' needs unk_id")
        unk_id = int(as_ids(unk_id, tab.vocab_size))
    job = Job(table=table_path or "", cache_bytes=cache_bytes,
              input=input if is_url(input) else os.path.abspath(input),
              keys=bool(keys), oov=oov, unk_id=unk_id, shape=tuple(int(s) for s in shape),
              dim=int(dim), dtype=dtype.str, vocab_size=int(tab.vocab_size), starts=starts,
              offsets=offsets, out_kind=kind,
              tmp="", stamp=_stamp(input, table_path))
    return job, line_lengths


def _stamp(input: str, table_path: str | None) -> tuple:
    stamp: tuple
    if is_url(input):
        stamp = tuple(remote_stamp(input))
    else:
        st = os.stat(input)
        stamp = (st.st_size, st.st_mtime_ns)
    if table_path:
        stamp += (remote_stamp(table_path, "zarr.json")[1] if is_url(table_path)
                  else os.stat(table_path).st_mtime_ns,)
    return stamp


def _run(tab, table_path, input, output, kind, *, keys, oov, unk_id, batch_rows, scheduler,
         overwrite, resume, lengths, on_progress, cache_bytes, n_workers, threads, t0) -> dict:
    job, line_lengths = _plan(tab, table_path, input, kind, keys=keys, oov=oov, unk_id=unk_id,
                              batch_rows=batch_rows, cache_bytes=cache_bytes)
    if resume and not overwrite and not is_url(output) and os.path.isdir(output):
        return _already_complete(output, job, lengths, scheduler, t0)
    tmp = output if is_url(output) else _tmp_path(output, kind)
    job = dataclasses.replace(job, tmp=tmp)
    if is_url(tmp):
        if not (resume and RemoteZarrSink.resumable(job)):
            RemoteZarrSink.create(job)
    elif kind == "zarr":
        if not (resume and os.path.isdir(tmp) and ZarrSink.resumable(job)):
            if resume and os.path.lexists(tmp):
                raise EmbstoreError(
                    f"cannot resume {output}: {tmp} holds the partial output of a different "
                    "job (other table, input, options or batch rows); run without resume=True "
                    "to start over")
            remove(tmp)
            try:
                ZarrSink.create(job)
            except BaseException:
                remove(tmp)  # a full disk: nothing half made stays
                raise
    else:
        try:
            job = dataclasses.replace(job, header_len=NpySink.create(
                tmp, job.shape + (job.dim,), job.dtype))
        except BaseException:
            remove(tmp)
            raise
    sink = open_sink(job)
    done = sink.done()
    todo = [i for i in range(job.n_blocks) if i not in done]
    lengths_tmp = None
    try:
        bar = Tally(job.rows, on_progress, sum(job.starts[i + 1] - job.starts[i] for i in done))
        if scheduler is not None:
            sink.close()
            run_dask(job, todo, scheduler, n_workers=n_workers, bar=bar)
        else:
            _run_local(job, tab, sink, todo, bar, threads=threads)
        sink.close()
        if lengths is not None:
            lengths_tmp = temp_path(lengths)
            with open(lengths_tmp, "wb") as f:
                np.save(f, line_lengths, allow_pickle=False)
    except BaseException as exc:
        try:
            sink.close()
        except OSError:
            pass  # a full disk fails the close too: clean up all the same
        if not (kind == "zarr" and _resumable_failure(exc)) and not is_url(tmp):
            remove(tmp)  # a remote output stays resumable (its zarr.json comes last)
        if lengths_tmp is not None:
            remove(lengths_tmp)
        raise
    if is_url(tmp):
        RemoteZarrSink.finish(job)
    else:
        if kind == "zarr":
            ZarrSink.finish(tmp)
        replace(tmp, output)
    if lengths_tmp is not None:
        replace(lengths_tmp, lengths)
    return {"output": output, "shape": job.shape + (job.dim,), "dtype": str(np.dtype(job.dtype)),
            "ids": int(np.prod(job.shape, dtype=np.int64)), "blocks": job.n_blocks,
            "resumed_blocks": len(done), "seconds": time.perf_counter() - t0,
            "scheduler": scheduler, "lengths": lengths}


def _already_complete(output: str, job: Job, lengths, scheduler, t0: float) -> dict:
    """The summary of a resumed job whose ``output`` is already complete (nothing to do),
    after checking that it is this job's: its shape and dtype; else the destination error."""
    import zarr
    want = job.shape + (job.dim,)
    try:
        arr = zarr.open_array(output, mode="r")
        same = tuple(arr.shape) == want and np.dtype(arr.dtype) == np.dtype(job.dtype)
    except Exception:  # noqa: BLE001 - not a Zarr array at all: another thing is there
        same = False
    if not same:
        raise DestinationExistsError(f"{output} exists and is not this job's complete output "
                                     f"(expected a {np.dtype(job.dtype)} array of shape "
                                     f"{want}); pass overwrite=True to replace it")
    return {"output": output, "shape": want, "dtype": str(np.dtype(job.dtype)),
            "ids": int(np.prod(job.shape, dtype=np.int64)), "blocks": job.n_blocks,
            "resumed_blocks": job.n_blocks, "seconds": time.perf_counter() - t0,
            "scheduler": scheduler, "lengths": lengths, "nothing_to_do": True}


def _resumable_failure(exc: BaseException) -> bool:
    """Whether a Zarr job that stopped on ``exc`` keeps its partial output for ``resume``.

    An interruption (Ctrl-C, exit) or an I/O failure (disk full, lost connection) may
    succeed when run again, so the finished blocks are kept; a data error or a bug
    would fail again, so its partial output is removed.
    """
    if not isinstance(exc, Exception):
        return True
    return isinstance(exc, OSError) and not isinstance(exc, EmbstoreError)


def _run_local(job: Job, tab: Table, sink, todo: list[int], bar: Tally, *,
               threads: bool) -> None:
    """Read block k+1 and write block k-1 in threads while block k is looked up."""
    if not todo:
        return
    source = open_source(job)
    per_row = int(np.prod(job.inner, dtype=np.int64)) * job.dim
    most = max(job.starts[i + 1] - job.starts[i] for i in todo)
    bufs = [np.empty(most * per_row, dtype=job.dtype) for _ in range(2 if threads else 1)]

    def compute(k: int, ids: np.ndarray | FilledIds) -> np.ndarray:
        out = bufs[k % len(bufs)][: ids.size * job.dim].reshape(ids.shape + (job.dim,))
        lookup_into(tab, ids, out, pads=job.pads)
        return out

    def rows(i: int) -> int:
        return job.starts[i + 1] - job.starts[i]

    if not threads:
        for k, i in enumerate(todo):
            sink.write(i, compute(k, read_block(job, source, i, tab)))
            bar.update(rows(i))
        return
    with ThreadPoolExecutor(1, "embstore-read") as reader, \
            ThreadPoolExecutor(1, "embstore-write") as writer:
        nxt = reader.submit(read_block, job, source, todo[0], tab)
        pending: Future | None = None
        last = todo[0]
        for k, i in enumerate(todo):
            ids = nxt.result()
            if k + 1 < len(todo):
                nxt = reader.submit(read_block, job, source, todo[k + 1], tab)
            out = compute(k, ids)
            if pending is not None:  # the buffer of block k-1 is free again after this
                pending.result()
                bar.update(rows(last))
            pending, last = writer.submit(sink.write, i, out), i
        assert pending is not None
        pending.result()
        bar.update(rows(last))
