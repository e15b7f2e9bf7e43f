"""scans: the four whole-table scans of a freshly opened format-2 table, warm and cold, each
against its limit (issue 29: within 1.5x).

- ``to_numpy`` (every page checked on its first read) against ``np.load`` of the same bytes
  (a copy into new memory);
- ``verify`` (every page against its checksum, every stored norm against its row) against
  ``np.load`` too, and, reported only, the crc32c of the same bytes (one call per 64 MiB,
  read into a reused buffer: the checksum library's own speed);
- ``export_table(t, "out.npy")`` (``embstore export``) against ``np.save`` of
  ``np.load(mmap_mode="r")`` of the same bytes (a copy of mapped bytes into a new file);
- the first exact ``most_similar`` after ``open`` (every page checked, rows read in place)
  against NumPy over a fresh ``np.load(mmap_mode="r")``: ``(E @ q) / norms`` with the same
  stored norms as a ``.npy``, then ``argpartition`` (the same arithmetic on the same bytes,
  freshly mapped), and, reported only, NumPy's pre-normalised copy in RAM.

Warm: the page cache holds every file (read through before timing). Cold: every file of the
table and the ``.npy`` evicted before each call (``posix_fadvise(DONTNEED)``, this process's
mappings dropped first): ``to_numpy`` against ``np.load`` cold, ``verify`` and the search
against a sequential read of the table's own files (16 MiB reads, as ``dd``: the bytes they
read, where they lie on the disk), the export against ``np.save`` of the mapped ``.npy``
read cold; each also beside a ``dd`` of the ``.npy`` (the same bytes in one file).
"""

from __future__ import annotations

import os

import numpy as np

from .. import data
from ..common import Method, Warmer, compare, evict, interleave, read_through

NAME = "scans"
TITLE = "Whole-table scans of a freshly opened format-2 table against their limits"
K = 10
BAR = ("within", 1.5)
SHORT = {"np.load": "np.load", "np.save": "np.save of the mapped .npy", "dd": "dd of the .npy",
         "dd-table": "dd of the table's files",
         "numpy": "NumPy over a fresh mapping", "crc": "crc32c of the bytes",
         "ram": "NumPy in RAM, pre-normalised"}


def _crc_of(path) -> int:
    """crc32c of ``path``'s bytes, 64 MiB at a time into one reused buffer."""
    from embstore.fs.checksum import crc32c
    buf = bytearray(max(1, min(64 << 20, os.path.getsize(path))))
    view = memoryview(buf)
    c = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            n = fh.readinto(view)
            if not n:
                return c
            c = crc32c(view[:n], c)


def _methods(ctx, cfg, npy, path, norms_npy, out_dir) -> dict[str, Method]:
    import embstore
    from embstore.convert import export_table
    from embstore.search.stream import most_similar

    rows = cfg["rows"]
    values = np.load(npy, mmap_mode="r")
    step = max(1, rows // 97)
    q = np.random.default_rng(3).standard_normal(values.shape[1]).astype(np.float32)
    e = np.load(npy)  # the reference answers (and NumPy's in-RAM copy)
    en = e / np.linalg.norm(e, axis=1, keepdims=True)
    del e
    want = _top(en @ q)

    def whole():
        with embstore.open(path, cache_bytes=0) as t:
            return t.to_numpy()

    def check_rows(out):
        if out.shape != values.shape or not np.array_equal(out[::step], values[::step]):
            raise AssertionError("to_numpy returned other rows")

    def check_ok(report):
        if not report.ok:
            raise AssertionError(str(report))

    emb_out, np_out = out_dir / "scans-embstore.npy", out_dir / "scans-numpy.npy"

    def export():
        export_table(path, emb_out, overwrite=True)
        return emb_out

    def check_export(out):
        got = np.load(out, mmap_mode="r")
        if got.shape != values.shape or not np.array_equal(got[::step], values[::step]):
            raise AssertionError("the export holds other rows")

    def np_save():
        np.save(np_out, np.load(npy, mmap_mode="r"))

    def first_search():
        with embstore.open(path) as t:
            return most_similar(t, q, k=K)

    def check_search(out):
        if not np.array_equal(out[0], want):
            raise AssertionError(f"embstore ids {out[0]} differ from NumPy's {want}")

    def numpy_fresh():
        rows_ = np.load(npy, mmap_mode="r")
        norms = np.load(norms_npy, mmap_mode="r")
        return _top((rows_ @ q) / norms)

    return {
        "to_numpy": Method("embstore to_numpy (fresh open)", "embstore", whole, unit="s",
                           check=check_rows),
        "verify": Method("embstore verify", "embstore", lambda: embstore.verify(path), unit="s",
                         check=check_ok),
        "export": Method("embstore export to .npy", "embstore", export, unit="s",
                         check=check_export, before=lambda: _remove(emb_out)),
        "search": Method("embstore open + first most_similar", "embstore", first_search,
                         unit="s", check=check_search),
        "np.load": Method("np.load (a copy of the same bytes)", "limit", lambda: np.load(npy),
                          unit="s"),
        "dd": Method("sequential read of the same bytes in the .npy (16 MiB reads, as dd)",
                     "limit", lambda: read_through([npy]), unit="s"),
        "dd-table": Method("sequential read of the table's files (16 MiB reads, as dd)",
                           "limit", lambda: read_through([path]), unit="s"),
        "crc": Method("crc32c of the same bytes (64 MiB reads)", "limit", lambda: _crc_of(npy),
                      unit="s"),
        "np.save": Method("np.save(np.load(mmap_mode='r')) (a copy into a new file)", "limit",
                          np_save, unit="s", before=lambda: _remove(np_out)),
        "numpy": Method("NumPy over a fresh np.load(mmap_mode='r'): (E @ q) / norms + argpartition",
                        "limit", numpy_fresh, unit="s",
                        check=lambda out: None if np.array_equal(out, want) else (
                            _ for _ in ()).throw(AssertionError("NumPy's own ids differ"))),
        "ram": Method("NumPy E_n @ q + argpartition (pre-normalised copy in RAM)", "limit",
                      lambda: _top(en @ q), unit="s"),
    }


def _then_evict(before, files):
    def run():
        if before is not None:
            before()
        evict(files)
    return run


def _remove(path) -> None:
    """(Untimed) the last call's output removed: each call writes a new file."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _top(s: np.ndarray) -> np.ndarray:
    i = np.argpartition(-s, K)[:K]
    return i[np.argsort(-s[i], kind="stable")]


def _norms_npy(ctx, path, npy) -> os.PathLike:
    """The table's stored norms as a ``.npy`` (NumPy's scan divides by the same values)."""
    import embstore
    out = ctx.data_dir / f"{npy.stem}-norms.npy"
    if not out.exists():
        with embstore.open(path) as t:
            src = t.norms_source
            norms = src.read(0, t.vocab_size)[:, 0] if src is not None else \
                np.linalg.norm(np.load(npy), axis=1).astype(np.float32)
        np.save(out, norms)
    return out


def run(ctx, res) -> None:
    cfg = ctx.cfg["scans"]
    rows, dim, reps = cfg["rows"], cfg["dim"], cfg["reps"]
    res.params = dict(cfg)
    npy = data.table_npy(ctx.data_dir, rows, dim)
    path = data.store(ctx.data_dir, npy)  # format 2 (new tables' default), stored norms
    norms_npy = _norms_npy(ctx, path, npy)
    m = _methods(ctx, cfg, npy, path, norms_npy, ctx.scratch)
    files = [npy, path, norms_npy]
    warm = [("to_numpy", "np.load"), ("verify", "np.load"), ("export", "np.save"),
            ("search", "numpy")]
    cold = [("to_numpy", "np.load"), ("verify", "dd-table"), ("export", "np.save"),
            ("search", "dd-table")]
    for temp, pairs in (("warm", warm), ("cold", cold)):
        case = f"{rows:,} x {dim} float32, format 2, freshly opened, page cache {temp}"
        names = ["to_numpy", "verify", "export", "search", "np.load", "np.save", "numpy"]
        names += ["crc", "ram"] if temp == "warm" else ["dd", "dd-table"]
        chosen = [m[k] for k in names]
        if temp == "cold":
            chosen = [Method(x.name, x.kind, x.fn, before=_then_evict(x.before, files),
                             unit="s", check=x.check) for x in chosen]
        found = interleave(res, case, chosen, reps=reps if temp == "warm" else cfg["cold_reps"],
                           warmer=Warmer(files) if temp == "warm" else None)
        for emb, lim in pairs:
            compare(res, f"{emb} {temp}: embstore vs {SHORT[lim]}", found.get(m[emb].name),
                    found.get(m[lim].name), target=BAR)
        if temp == "warm":
            compare(res, f"verify warm: embstore vs {SHORT['crc']}", found.get(m["verify"].name),
                    found.get(m["crc"].name))
            compare(res, f"search warm: embstore first query vs {SHORT['ram']}",
                    found.get(m["search"].name), found.get(m["ram"].name))
        else:
            for emb in ("to_numpy", "verify", "search"):
                compare(res, f"{emb} cold: embstore vs {SHORT['dd']}", found.get(m[emb].name),
                        found.get(m["dd"].name))
