"""Deterministic synthetic data for the benchmarks, built once under the data folder.

Every file is named by its parameters and written beside its final name, then
renamed, so a file that exists is complete and is reused by later runs.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import numpy as np

import embstore

from .common import Skip, log

BLOCK_BYTES = 64 << 20


def _block_rows(row_bytes: int) -> int:
    return max(1, BLOCK_BYTES // max(1, row_bytes))


def _fresh(path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    if tmp.is_dir():
        shutil.rmtree(tmp)
    elif tmp.exists():
        tmp.unlink()
    return tmp


def table_npy(data_dir: Path, rows: int, dim: int, *, seed: int = 0) -> Path:
    """A (rows, dim) float32 standard-normal table as ``.npy`` (generated block by block)."""
    path = Path(data_dir) / f"table-{rows}x{dim}-s{seed}.npy"
    if path.exists():
        return path
    log(f"generating {path.name} ({rows * dim * 4 / 1e9:.2f} GB)")
    tmp = _fresh(path)
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(rows, dim))
    step = _block_rows(dim * 4)
    for b, start in enumerate(range(0, rows, step)):
        stop = min(rows, start + step)
        rng = np.random.default_rng([seed, b])
        out[start:stop] = rng.standard_normal((stop - start, dim), dtype=np.float32)
    out.flush()
    del out
    os.replace(tmp, path)
    return path


def load_in_ram(path: Path) -> np.ndarray:
    return np.load(path, allow_pickle=False)


def ids(rows: int, shape, dist: str, *, seed: int) -> np.ndarray:
    """int64 ids: ``uniform`` over the table, or ``zipf<a>`` (``zipf1.1``): a truncated Zipf(a)
    over ranks 1..rows (:func:`zipf_ranks`, exact), rank r being row ``zipf_order(rows)[r - 1]``
    (a fixed random permutation, so the hot rows are scattered over the table)."""
    rng = np.random.default_rng([seed, rows, 7])
    if dist == "uniform":
        return rng.integers(0, rows, size=shape, dtype=np.int64)
    if dist.startswith("zipf"):
        a = float(dist[4:] or 1.1)
        return zipf_order(rows)[zipf_ranks(rng, rows, a, shape) - 1]
    raise ValueError(f"unknown id distribution {dist!r}")


def zipf_pmf(rows: int, a: float) -> np.ndarray:
    """P(rank r) for r = 1..rows of the truncated Zipf(a): ``r ** -a / sum(k ** -a)``."""
    w = np.arange(1, rows + 1, dtype=np.float64) ** -a
    return w / w.sum()


@functools.lru_cache(maxsize=2)
def zipf_order(rows: int) -> np.ndarray:
    """Row id of each Zipf rank (``[0]``: the hottest row), a fixed random permutation."""
    order = np.random.default_rng([rows, 11]).permutation(rows)
    order.flags.writeable = False
    return order


def _log1p_x(x):  # log1p(x) / x, also near 0
    small = np.abs(x) <= 1e-8
    return np.where(small, 1 - x * (0.5 - x * (1 / 3 - 0.25 * x)),
                    np.log1p(x) / np.where(small, 1.0, x))


def _expm1_x(x):  # expm1(x) / x, also near 0
    small = np.abs(x) <= 1e-8
    return np.where(small, 1 + x * 0.5 * (1 + x / 3 * (1 + 0.25 * x)),
                    np.expm1(x) / np.where(small, 1.0, x))


def zipf_ranks(rng, rows: int, a: float, shape) -> np.ndarray:
    """int64 ranks 1..rows drawn from the truncated Zipf(a), P(r) = r ** -a / H(rows, a).

    Rejection-inversion (Hormann & Derflinger 1996, as Apache Commons RNG samples a bounded
    Zipf): exact for any ``rows``, O(1) memory, vectorised (about 1 draw in 50 is
    rejected and drawn again).  Nothing folds back over the table, unlike
    ``(rng.zipf(a) - 1) % rows``, which at a = 1.1 puts 15-19% of its draws past 90M rows.
    """
    if not (a > 0 and rows >= 1):
        raise ValueError(f"zipf needs a > 0 and rows >= 1, got a={a}, rows={rows}")

    def hint(x):  # integral of x ** -a from 1 to x
        lx = np.log(x)
        return _expm1_x((1 - a) * lx) * lx

    def hinv(y):
        return np.exp(_log1p_x(np.maximum(y * (1 - a), -1.0)) * y)

    hx1, hn = hint(1.5) - 1.0, hint(rows + 0.5)
    s = 2.0 - hinv(hint(2.5) - 2.0 ** -a)
    n = int(np.prod(shape, dtype=np.int64))
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        u = hn + rng.random(todo.size) * (hx1 - hn)
        x = hinv(u)
        k = np.clip((x + 0.5).astype(np.int64), 1, rows)
        ok = (k - x <= s) | (u >= hint(k + 0.5) - np.exp(-a * np.log(k)))
        out[todo[ok]] = k[ok]
        todo = todo[~ok]
    return out.reshape(shape)


def ids_npy(data_dir: Path, rows: int, n: int, dist: str, *, seed: int = 0, width: int = 512) -> Path:
    """A ``.npy`` of int64 ids of shape ``(n // width, width)`` (a batch job's input)."""
    path = Path(data_dir) / f"ids-{n}-of-{rows}-{dist}-s{seed}.npy"
    if path.exists():
        return path
    tmp = _fresh(path)
    with open(tmp, "wb") as fh:  # a file object: np.save would append ".npy" to the name
        np.save(fh, ids(rows, (n // width, width), dist, seed=seed))
    os.replace(tmp, path)
    return path


def key_width(rows: int) -> int:
    return 1 + max(7, len(str(max(0, rows - 1))))


def keys(rows: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Keys ``w0000000``, ``w0000001``, ... of a table of ``rows`` rows (fixed width), rows
    ``start:stop``, as a NumPy unicode array."""
    stop = rows if stop is None else stop
    return np.char.add("w", np.char.zfill(np.arange(start, stop).astype(str), key_width(rows) - 1))


def _w2v_block(rng, rows: int, start: int, stop: int, dim: int):
    """Text bytes of rows ``start:stop`` of a word2vec file and their float32 values.

    Values are normal(0, 0.3) written with 5 decimals (``-0.12345``), like a
    trained model's output; parsing the text gives back ``values`` exactly.
    """
    n = stop - start
    x = rng.standard_normal((n, dim)) * 0.3
    q = np.minimum(np.rint(np.abs(x) * 1e5), 999_999).astype(np.int64)
    neg = (x < 0) & (q > 0)
    values = (np.where(neg, -q, q) / 1e5).astype(np.float32)
    # each value: ' ' sign d '.' ddddd (9 bytes), sign byte 0 (dropped) when positive
    field = np.empty((n, dim, 9), dtype=np.uint8)
    field[..., 0] = ord(" ")
    field[..., 1] = np.where(neg, ord("-"), 0)
    field[..., 2] = ord("0") + q // 100_000
    field[..., 3] = ord(".")
    for k in range(5):
        field[..., 4 + k] = ord("0") + (q // 10 ** (4 - k)) % 10
    kw = key_width(rows)
    key = np.frombuffer(keys(rows, start, stop).astype(f"S{kw}").tobytes(), dtype=np.uint8)
    line = np.empty((n, kw + dim * 9 + 1), dtype=np.uint8)
    line[:, :kw] = key.reshape(n, kw)
    line[:, kw:-1] = field.reshape(n, dim * 9)
    line[:, -1] = ord("\n")
    flat = line.reshape(-1)
    return flat[flat != 0].tobytes(), values


def w2v_text(data_dir: Path, rows: int, dim: int, *, seed: int = 0) -> tuple[Path, Path]:
    """A word2vec text file (``rows dim`` header, one ``key v1 .. vdim`` line a row) and
    a ``.npy`` of the exact float32 values it holds."""
    base = Path(data_dir) / f"w2v-{rows}x{dim}-s{seed}"
    txt, npy = base.with_suffix(".txt"), base.with_suffix(".values.npy")
    if txt.exists() and npy.exists():
        return txt, npy
    log(f"generating {txt.name} (about {rows * (dim * 9 + 10) / 1e9:.2f} GB of text)")
    ttmp, ntmp = _fresh(txt), _fresh(npy)
    vals = np.lib.format.open_memmap(ntmp, mode="w+", dtype=np.float32, shape=(rows, dim))
    step = _block_rows(dim * 9 * 3)
    with open(ttmp, "wb") as fh:
        fh.write(f"{rows} {dim}\n".encode())
        for b, start in enumerate(range(0, rows, step)):
            stop = min(rows, start + step)
            text, values = _w2v_block(np.random.default_rng([seed, b, 2]), rows, start, stop, dim)
            fh.write(text)
            vals[start:stop] = values
    vals.flush()
    del vals
    os.replace(ntmp, npy)
    os.replace(ttmp, txt)
    return txt, npy


def w2v_binary(data_dir: Path, rows: int, dim: int, *, newline: bool = True,
               seed: int = 0) -> Path:
    """The vectors and keys of :func:`w2v_text` as a word2vec binary file: ``rows dim``
    header, then ``key b" " float32 x dim`` per row, followed by ``b"\\n"`` as the C tool
    writes it (``newline``) or not, as gensim's ``save_word2vec_format(binary=True)`` does
    (byte for byte)."""
    path = Path(data_dir) / f"w2v-{rows}x{dim}-s{seed}-{'c' if newline else 'gensim'}.bin"
    if path.exists():
        return path
    _, npy = w2v_text(data_dir, rows, dim, seed=seed)
    values = np.load(npy, mmap_mode="r", allow_pickle=False)
    kw = key_width(rows)
    fields = [("key", f"S{kw}"), ("space", "S1"), ("vec", "<f4", (dim,))]
    record = np.dtype(fields + ([("newline", "S1")] if newline else []))
    log(f"generating {path.name} ({rows * record.itemsize / 1e9:.2f} GB)")
    tmp = _fresh(path)
    step = _block_rows(record.itemsize)
    with open(tmp, "wb") as fh:
        fh.write(f"{rows} {dim}\n".encode())
        for start in range(0, rows, step):
            stop = min(rows, start + step)
            block = np.empty(stop - start, record)
            block["key"] = keys(rows, start, stop).astype(f"S{kw}")
            block["space"] = b" "
            block["vec"] = values[start:stop]
            if newline:
                block["newline"] = b"\n"
            fh.write(block.tobytes())
    os.replace(tmp, path)
    return path


def gensim_native(data_dir: Path, rows: int, dim: int, *, seed: int = 0) -> Path:
    """The same vectors and keys saved by gensim's native ``KeyedVectors.save``."""
    try:
        from gensim.models import KeyedVectors
    except ImportError:
        raise Skip("gensim not installed") from None
    path = Path(data_dir) / f"gensim-{rows}x{dim}-s{seed}.kv"
    if path.exists():
        return path
    _, npy = w2v_text(data_dir, rows, dim, seed=seed)
    log(f"generating {path.name}")
    kv = KeyedVectors(vector_size=dim, count=0, dtype=np.float32)
    kv.add_vectors(keys(rows).tolist(), np.load(npy, allow_pickle=False))
    tmp = path.with_name(f"tmp{os.getpid()}-{path.name}")
    kv.save(str(tmp))  # big arrays go to tmp.vectors.npy (memory-mappable)
    for side in sorted(tmp.parent.glob(tmp.name + ".*")):
        os.replace(side, path.parent / (path.name + side.name[len(tmp.name):]))
    os.replace(tmp, path)
    return path


def gensim_files(path: Path) -> list[Path]:
    return [path, *sorted(path.parent.glob(path.name + ".*"))]


# ---------------------------------------------------------------- embstore stores

def store(data_dir: Path, source: Path, *, compression: str = "none", with_keys: bool = False,
          layout: dict | None = None) -> Path:
    """An embstore table holding ``source`` (a 2-D ``.npy``), saved once with the default layout."""
    es = embstore
    arr = np.load(source, mmap_mode="r", allow_pickle=False)
    tag = "-".join(f"{k}{v}" for k, v in sorted((layout or {}).items()))
    name = f"{Path(source).stem}-{compression}{'-keys' if with_keys else ''}{'-' + tag if tag else ''}"
    path = Path(data_dir) / f"{name}.embstore"
    if path.exists():
        try:
            with es.open(path) as t:
                fmt = (layout or {}).get("format_version")  # None: what save picks today
                if tuple(t.shape) == arr.shape and (t.keys is not None) == with_keys and (
                        fmt is None or t.layout.get("format", 1) == fmt) and (
                        fmt is not None or compression != "none" or t.layout.get("format") == 2
                        or bool(set(layout or {}) & {"chunk_rows", "shard_rows"})):
                    return path
        except Exception:  # noqa: BLE001 - a store from an older build: rebuild it
            pass
        log(f"rebuilding {path.name}")
    log(f"saving {path.name}")
    kw = dict(layout or {})
    es.save(path, arr, keys=keys(arr.shape[0]) if with_keys else None, compression=compression,
            overwrite=True, **kw).close()
    return path


def vectors_path(store_path: Path) -> Path:
    return Path(store_path) / "vectors"
