"""import-compressed: the same word2vec text file imported plain and gzip, bzip2, xz and
zstd compressed, against gensim's ``load_word2vec_format`` of the ``.gz``.

Each import runs in a fresh process (``embstore import SRC DEST --quiet``); the
compressed copies are made once with the standard library (gzip level 6, bzip2 9,
xz preset 3 to keep the full run's set-up short, zstd level 3).  Reported: the
work's time and CPU time; the target is the issue's: a ``.gz`` import at most
1.3x the plain one.  On a shared machine wall times swing with the load: the CPU
time ratio (user + system of the child) is the steadier figure.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
from pathlib import Path

import zstandard

from .. import data
from ..children import child_method_runs, run_child
from ..common import Measurement, Warmer, compare, log
from .import_w2v import _check_store

NAME = "import-compressed"
TITLE = "Import a compressed word2vec text file (gz, bz2, xz, zst)"

GENSIM = "gensim load_word2vec_format(.gz)"
KINDS = {"gz": lambda src, dst: _stream(src, gzip.open(dst, "wb", compresslevel=6)),
         "bz2": lambda src, dst: _stream(src, bz2.open(dst, "wb")),
         "xz": lambda src, dst: _stream(src, lzma.open(dst, "wb", preset=3)),
         "zst": lambda src, dst: _stream(src, zstandard.ZstdCompressor(level=3).stream_writer(
             open(dst, "wb")))}


def _stream(src: Path, out) -> None:
    with open(src, "rb") as f, out:
        shutil.copyfileobj(f, out, 8 << 20)


def _copy(txt: Path, ext: str) -> Path:
    """``txt.<ext>``, made once beside the data file (written beside, renamed in place)."""
    out = txt.with_name(txt.name + "." + ext)
    if not out.exists():
        log(f"compressing {txt.name} -> {out.name}")
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        KINDS[ext](txt, tmp)
        os.replace(tmp, out)
    return out


def method(ext: str | None) -> str:
    return "embstore import (plain)" if ext is None else f"embstore import (.{ext})"


def run(ctx, res) -> None:
    cfg = ctx.cfg[NAME]
    rows, dim, reps = cfg["rows"], cfg["dim"], cfg["reps"]
    txt, npy = data.w2v_text(ctx.data_dir, rows, dim)
    files = {None: txt, **{ext: _copy(txt, ext) for ext in KINDS}}
    res.params = {"rows": rows, "dim": dim, "reps": reps,
                  "file_bytes": {str(k or "plain"): p.stat().st_size for k, p in files.items()}}
    dest = ctx.scratch / "import-compressed.embstore"

    def clean():
        if dest.exists():
            shutil.rmtree(dest)

    def importer(path):
        return lambda: run_child("cli", "import", path, dest, "--quiet", "--overwrite")

    runs = {method(ext): ("embstore", importer(path)) for ext, path in files.items()}
    runs[GENSIM] = ("peer", lambda: run_child("gensim-w2v", files["gz"]))

    def check(name, out):
        if name != GENSIM:
            _check_store(dest, npy, rows)
        elif out.get("rows") != rows:
            raise AssertionError(f"gensim read {out.get('rows')} rows, expected {rows}")

    case = f"{rows:,} x {dim}"
    try:
        done = child_method_runs(res, case, runs, reps=reps, warmer=Warmer(list(files.values())),
                                 before=clean, check=check)
    finally:
        clean()
    for name, datas in done.items():  # CPU time: steadier than wall time on a busy machine
        if datas and all("cpu_seconds" in d for d in datas):
            res.measurements.append(Measurement(case, name + " [CPU]", runs[name][0], "s",
                                                [float(d["cpu_seconds"]) for d in datas]))
    f = res.find
    plain = f(case, method(None))
    for ext in KINDS:
        target = ("within", 1.3) if ext == "gz" else None
        compare(res, f"import .{ext} vs plain", f(case, method(ext)), plain, target=target)
    compare(res, "import .gz vs plain, CPU time", f(case, method("gz") + " [CPU]"),
            f(case, method(None) + " [CPU]"), target=("within", 1.3))
    compare(res, "import .gz: embstore vs gensim", f(case, method("gz")), f(case, GENSIM),
            target=("faster", 1))
