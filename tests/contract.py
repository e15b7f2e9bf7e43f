"""The Table contract, written once as :class:`TableContract`; every backend subclasses it.

Not collected itself (no ``test_`` prefix, no ``Test`` class): each backend's test file
holds a ``Test...`` subclass that runs the whole class, as zarr-python's
``zarr.testing.store.StoreTests`` is subclassed by ``tests/test_store/test_local.py``.
A test added here runs on every backend without being named anywhere else.

Backends today: tests/test_contract.py (MemoryTable, each local layout, each storage
dtype), tests/test_foreign.py (tables written by zarr-python), tests/remote/
test_remote_contract.py (tables on S3).  (tests/conftest.py's ``make_table`` runs the
layer, bag and search tests, not the contract, on a few local layouts.)

Adding a backend (a storage medium, a layout, a storage dtype) is one subclass in the
test file of that medium: its capabilities as class attributes (the tests consult them,
never a backend's name) and a ``make_table`` fixture, unless the rows are written by
``embstore.save`` to a local path (then :class:`SavedTables` and a ``layout`` do)::

    class TestMyMedium(TableContract):
        writable = False  # the write tests then assert the ReadOnlyError

        @pytest.fixture
        def make_table(self, tmp_path):
            def make(array, keys=None, mode="r+"):
                ...  # store ``array`` (float32 rows) and ``keys``; return the table opened
            return make

    class TestInt8Zstd(SavedTables):
        storage_dtype = "int8"
        layout = {"compression": "zstd", "chunk_rows": 8, "shard_rows": 32}

A new storage dtype also gives its round trip, computed without embstore, in
``ROUND_TRIPS`` (tests/test_contract.py checks every record of embstore.dtypes.DTYPES has
one and a subclass).
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import embstore
from embstore import InvalidIdError, KeyNotFoundError, ReadOnlyError

V, D = 37, 5
INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


# -- what each storage dtype returns for float32 rows written to it (independent of embstore)
def bf16_by_torch(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 -> float32 by PyTorch (round to nearest, ties to even)."""
    torch = pytest.importorskip("torch")
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def int8_by_spec(x: np.ndarray) -> np.ndarray:
    """docs/FORMAT.md §3c written out in NumPy: quantise each row, then dequantise in float32
    (rows whose step is a normal float32, as every row of random normal values)."""
    x64 = np.asarray(x, np.float64)
    lo, hi = x64.min(axis=1), x64.max(axis=1)
    scale = ((hi - lo) / 255.0).astype(np.float32)
    offset = (lo + 128.0 * scale.astype(np.float64)).astype(np.float32)
    step = np.where(scale > 0, scale.astype(np.float64), 1.0)
    codes = np.clip(np.rint((x64 - offset[:, None]) / step[:, None]), -128, 127)
    codes[scale == 0] = 0
    return codes.astype(np.int8).astype(np.float32) * scale[:, None] + offset[:, None]


ROUND_TRIPS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "float32": lambda x: np.array(x, np.float32),
    "float64": lambda x: np.asarray(x, np.float32).astype(np.float64),
    "float16": lambda x: np.asarray(x, np.float32).astype(np.float16),
    "bfloat16": bf16_by_torch,
    "int8": int8_by_spec,
}


class TableContract:
    """What every :class:`embstore.Table` does, whatever holds its rows.

    A subclass provides ``make_table``: a fixture returning ``make(array, keys=None,
    mode="r+")``, a table of that backend holding the float32 rows ``array`` (stored in
    ``storage_dtype``), opened with ``mode`` (a backend that only reads may ignore it).
    """

    storage_dtype = "float32"  # rows are stored so: lookups return ROUND_TRIPS[it](rows)
    writable = True  # write/append accepted in mode "r+"; False: refused (ReadOnlyError)
    remote = False  # rows on object storage (Table.is_remote)
    # how far a stored value may be from the float32 written (the tolerance of lossy
    # dtypes): rtol * |x| + atol + row_steps * (the row's range / 255, plus an ulp)
    rtol = 0.0
    atol = 0.0
    row_steps = 0.0

    @pytest.fixture
    def make_table(self):
        raise NotImplementedError(f"{type(self).__name__} must provide a make_table fixture")

    @pytest.fixture
    def E(self, rng):
        return rng.standard_normal((V, D)).astype(np.float32)

    @pytest.fixture
    def KEYS(self):
        return [f"w{i}" for i in range(V - 3)] + ["", "naïve", "東京 tower"]

    def stored(self, rows: np.ndarray) -> np.ndarray:
        """What the table returns for float32 ``rows`` written to it."""
        return ROUND_TRIPS[self.storage_dtype](rows)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of lookups."""
        return self.stored(np.zeros((1, 1), np.float32)).dtype

    def assert_refuses_writes(self, t, rows: np.ndarray) -> None:
        """A table that is not writable refuses write and append and keeps its rows."""
        with pytest.raises(ReadOnlyError, match="read-only"):
            t.write([0], np.zeros((1, t.dim), np.float32))
        with pytest.raises(ReadOnlyError, match="read-only"):
            t.append(np.zeros((1, t.dim), np.float32))
        assert len(t) == len(rows)
        np.testing.assert_array_equal(t.to_numpy(), self.stored(rows))

    # -- geometry and lookups ---------------------------------------------------------------
    def test_geometry(self, make_table, E):
        t = make_table(E)
        assert t.shape == (V, D) and t.vocab_size == V == len(t) and t.dim == D
        assert t.dtype == self.dtype
        assert t.keys is None
        assert isinstance(t, embstore.Table)

    def test_declares_its_capabilities(self, make_table, E):
        t = make_table(E)
        assert t.storage_dtype == self.storage_dtype
        assert t.writable is self.writable and t.is_remote is self.remote
        assert make_table(E, mode="r").writable is False

    def test_stored_values_within_the_dtypes_precision(self, make_table, E):
        got = make_table(E, mode="r").to_numpy().astype(np.float64)
        err = np.abs(got - E)
        bound = self.rtol * np.abs(E) + self.atol
        if self.row_steps:
            step = (E.max(axis=1) - E.min(axis=1)).astype(np.float64)[:, None] / 255
            bound = bound + self.row_steps * step + np.spacing(np.abs(E))
        assert (err <= bound).all(), f"largest error {err.max()}, allowed {bound.max()}"

    @pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 4), (2, 3, 4), (2, 1, 3, 2)],
                             ids=str)
    def test_lookup_any_shape(self, make_table, E, rng, shape):
        t, R = make_table(E), self.stored(E)
        ids = rng.integers(0, V, size=shape)
        got = t.lookup(ids)
        assert got.shape == tuple(shape) + (D,)
        assert got.dtype == self.dtype and got.flags.c_contiguous
        np.testing.assert_array_equal(got, R[ids])
        np.testing.assert_array_equal(t[ids], R[ids])
        np.testing.assert_array_equal(t(ids), R[ids])

    def test_lookup_python_int_and_list(self, make_table, E):
        t, R = make_table(E), self.stored(E)
        np.testing.assert_array_equal(t[3], R[3])
        np.testing.assert_array_equal(t[[3, 3, 0, V - 1]], R[[3, 3, 0, V - 1]])
        np.testing.assert_array_equal(t[[[1, 2], [2, 1]]], R[[[1, 2], [2, 1]]])
        assert t[[]].shape == (0, D)

    def test_scalar_result_is_a_copy(self, make_table, E):
        t = make_table(E)
        row = t[4]
        row[:] = 99
        np.testing.assert_array_equal(t[4], self.stored(E)[4])

    @pytest.mark.parametrize("dtype", INT_DTYPES)
    def test_every_integer_dtype(self, make_table, E, rng, dtype):
        t = make_table(E)
        hi = min(V, np.iinfo(dtype).max + 1)
        ids = rng.integers(0, hi, size=(4, 6)).astype(dtype)
        np.testing.assert_array_equal(t[ids], self.stored(E)[ids.astype(np.int64)])

    def test_out_buffer(self, make_table, E, rng):
        t = make_table(E)
        ids = rng.integers(0, V, size=(3, 4))
        out = np.full((3, 4, D), -1, dtype=self.dtype)
        res = t.lookup(ids, out=out)
        assert res is out
        np.testing.assert_array_equal(out, self.stored(E)[ids])

    @pytest.mark.parametrize("bad_out", ["dtype", "shape", "noncontiguous"])
    def test_out_buffer_checked(self, make_table, E, bad_out):
        t = make_table(E)
        other = np.float32 if self.dtype == np.float64 else np.float64
        out = {"dtype": np.empty((3, 4, D), other),
               "shape": np.empty((3, 5, D), self.dtype),
               "noncontiguous": np.empty((3, 4, D * 2), self.dtype)[..., ::2]}[bad_out]
        with pytest.raises(embstore.ShapeMismatchError, match="out must"):
            t.lookup(np.zeros((3, 4), np.int64), out=out)

    def test_slices(self, make_table, E):
        t, R = make_table(E), self.stored(E)
        np.testing.assert_array_equal(t[2:9], R[2:9])
        np.testing.assert_array_equal(t[:], R)
        np.testing.assert_array_equal(t[-3:], R[-3:])
        np.testing.assert_array_equal(t[::5], R[::5])
        assert t[10:2].shape == (0, D)
        np.testing.assert_array_equal(t.to_numpy(), R)

    @pytest.mark.parametrize("bad, first, pos", [
        (-1, -1, ()),
        (V, V, ()),
        ([0, 1, V + 5, -2], V + 5, (2,)),
        (np.array([[0, 1], [2, -7]]), -7, (1, 1)),
        (np.array([3, 2**63 + 5], dtype=np.uint64), 2**63 + 5, (1,)),
        (np.array([[1], [200]], dtype=np.uint8), 200, (1, 0)),
        (2**70, 2**70, ()),
    ], ids=["negative", "too-large", "list", "2d-negative", "uint64-huge", "uint8", "pyint-huge"])
    def test_bad_ids_raise(self, make_table, E, bad, first, pos):
        t = make_table(E)
        with pytest.raises(InvalidIdError) as info:
            t.lookup(bad)
        assert info.value.id == first and info.value.position == pos
        assert str(first) in str(info.value)
        if pos != ():  # a single id has no position worth naming (issue 34)
            assert str(pos) in str(info.value)
        assert isinstance(info.value, IndexError) and isinstance(info.value, embstore.EmbstoreError)

    @pytest.mark.parametrize("bad", [
        1.0, True, np.float32(2), "3", None, [1, 2.5], [0, True], np.array([1.0, 2.0]),
        np.array([True, False]), np.array(["1"]), np.array([1, 2], dtype=object), [[1, 2], [3]],
    ], ids=["float", "bool", "np-float", "str", "none", "list-float", "list-bool", "float-array",
            "bool-array", "str-array", "object-array", "ragged"])
    def test_non_integer_ids_raise(self, make_table, E, bad):
        t = make_table(E)
        with pytest.raises(InvalidIdError):
            t.lookup(bad)

    # -- writes -----------------------------------------------------------------------------
    def test_write_and_append(self, make_table, E, rng):
        t = make_table(E)
        if not self.writable:
            self.assert_refuses_writes(t, E)
            return
        ref = self.stored(E)
        ids = np.array([[0, 5], [36, 5]])
        vec = rng.standard_normal((2, 2, D)).astype(np.float32)
        t.write(ids, vec)
        sv = self.stored(vec.reshape(-1, D)).reshape(vec.shape)
        ref[[0, 36]] = sv[0, 0], sv[1, 0]
        ref[5] = sv[1, 1]  # the last write of a duplicate id wins
        np.testing.assert_array_equal(t[np.arange(V)], ref)
        new = rng.standard_normal((3, D)).astype(np.float32)
        got = t.append(new)
        np.testing.assert_array_equal(got, [V, V + 1, V + 2])
        assert len(t) == V + 3
        sn = self.stored(new)
        np.testing.assert_array_equal(t[[V + 2, 1, V]], np.stack([sn[2], ref[1], sn[0]]))

    def test_write_checks(self, make_table, E):
        t = make_table(E)
        if not self.writable:
            self.assert_refuses_writes(t, E)
            return
        with pytest.raises(embstore.ShapeMismatchError, match="shape"):
            t.write([1, 2], np.zeros((3, D)))
        with pytest.raises(InvalidIdError):
            t.write([V], np.zeros((1, D)))
        with pytest.raises(embstore.ShapeMismatchError, match="NaN"):
            t.write([1], np.full((1, D), np.nan))
        np.testing.assert_array_equal(t[1], self.stored(E)[1])

    def test_read_only(self, make_table, E):
        self.assert_refuses_writes(make_table(E, mode="r"), E)

    # -- keys -------------------------------------------------------------------------------
    def test_keys(self, make_table, E, KEYS):
        t, R = make_table(E, keys=KEYS), self.stored(E)
        assert len(t.keys) == V and list(t.keys) == KEYS
        assert t.keys[3] == "w3" and t.keys[-1] == "東京 tower" and t.keys[1:4] == KEYS[1:4]
        assert "naïve" in t.keys and "nope" not in t.keys
        np.testing.assert_array_equal(t.ids_of(["w2", "", "東京 tower"]), [2, V - 3, V - 1])
        ids = t.ids_of([["w1", "w0"], ["naïve", "w9"]])
        assert ids.dtype == np.int64 and ids.shape == (2, 2)
        np.testing.assert_array_equal(ids, [[1, 0], [V - 2, 9]])
        assert t.ids_of("w7") == 7
        np.testing.assert_array_equal(t.ids_of(["w1", "zzz"], missing=-1), [1, -1])
        np.testing.assert_array_equal(t.lookup_keys(["w4", "naïve"]), R[[4, V - 2]])

    def test_unknown_keys(self, make_table, E, KEYS):
        t, R = make_table(E, keys=KEYS), self.stored(E)
        with pytest.raises(KeyNotFoundError, match="'zzz' at position \\(1,\\)"):
            t.ids_of(["w1", "zzz"])
        with pytest.raises(KeyError):
            t.lookup_keys(["zzz"])
        got = t.lookup_keys([["w1", "zzz"]], oov="zero")
        np.testing.assert_array_equal(got, np.stack([[R[1], np.zeros(D, self.dtype)]]))
        got = t.lookup_keys(["zzz", "w2"], oov="unk", unk_id=5)
        np.testing.assert_array_equal(got, R[[5, 2]])

    def test_keys_absent(self, make_table, E):
        t = make_table(E)
        with pytest.raises(KeyNotFoundError, match="no keys"):
            t.ids_of(["a"])

    def test_append_with_keys(self, make_table, E, KEYS):
        t = make_table(E, keys=KEYS)
        if not self.writable:
            self.assert_refuses_writes(t, E)
            return
        new = np.ones((2, D), np.float32)
        ids = t.append(new, keys=["new1", "new2"])
        np.testing.assert_array_equal(ids, [V, V + 1])
        np.testing.assert_array_equal(t.ids_of(["new2", "w0"]), [V + 1, 0])
        assert t.keys[V] == "new1"
        with pytest.raises(embstore.ShapeMismatchError, match="already exists"):
            t.append(new[:1], keys=["w3"])
        with pytest.raises(KeyNotFoundError):
            t.append(new[:1])

    # -- NumPy and Python protocols ---------------------------------------------------------
    def test_asarray_reads_blocks_not_rows(self, make_table, rng, monkeypatch):
        A = rng.standard_normal((300, 6)).astype(np.float32)
        t, R = make_table(A, mode="r"), self.stored(A)
        monkeypatch.setattr(type(t), "lookup", lambda *a, **k: pytest.fail("read row by row"))
        got = np.asarray(t)
        np.testing.assert_array_equal(got, R)
        assert got.dtype == self.dtype and got.shape == (300, 6)
        got64 = np.asarray(t, dtype=np.float64)
        assert got64.dtype == np.float64
        np.testing.assert_array_equal(got64, R.astype(np.float64))
        np.testing.assert_array_equal(np.array(t), R)
        if np.lib.NumpyVersion(np.__version__) >= "2.0.0":  # NumPy 1 never passes copy=
            with pytest.raises(ValueError, match="without a copy"):
                np.array(t, copy=False)
        with pytest.raises(ValueError, match="without a copy"):
            t.__array__(copy=False)

    def test_iter_and_list_read_blocks(self, make_table, rng, monkeypatch):
        A = rng.standard_normal((300, 6)).astype(np.float32)
        t, R = make_table(A, mode="r"), self.stored(A)
        monkeypatch.setattr(type(t), "lookup", lambda *a, **k: pytest.fail("read row by row"))
        rows = list(t)
        assert len(rows) == 300
        np.testing.assert_array_equal(np.stack(rows), R)
        np.testing.assert_array_equal(next(iter(t)), R[0])

    def test_contains_tests_keys(self, make_table, rng):
        A = rng.standard_normal((300, 6)).astype(np.float32)
        t = make_table(A, keys=[f"w{i}" for i in range(300)], mode="r")
        assert "w7" in t and "w299" in t
        assert "nope" not in t and "" not in t
        with pytest.raises(TypeError, match=r"'in' tests keys \(str\) of a table, got int 3"):
            3 in t  # noqa: B015
        plain = make_table(A, mode="r")
        assert "w7" not in plain

    # -- threads and lifetime ---------------------------------------------------------------
    def test_threads_read_concurrently(self, make_table, rng):
        A = rng.standard_normal((500, 8)).astype(np.float32)
        t, R = make_table(A, mode="r"), self.stored(A)
        errors = []

        def work(seed):
            r = np.random.default_rng(seed)
            for _ in range(20):
                ids = r.integers(0, 500, size=(16, 8))
                if not np.array_equal(t[ids], R[ids]):
                    errors.append(seed)

        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []

    def test_context_manager(self, make_table, E):
        with make_table(E) as t:
            np.testing.assert_array_equal(t[1], self.stored(E)[1])
        info = t.cache_info()
        assert set(info._fields) == {"hits", "misses", "evictions", "entries", "bytes",
                                     "capacity_bytes"}


def copy_tree(src: Path, dest: Path) -> None:
    """Copy the folder ``src`` to ``dest`` as ``cp -a`` does (files that are hard links of
    each other stay so: the live files and the version folders of docs/FORMAT.md §6), with
    no fsync: a test's scratch copy (embstore.fs.copytree.copy_folder, the same walk with
    an fsync a file, took test_contract from 8 to 13 CPU-s and 9 to 157 s wall under load)."""
    first: dict[tuple[int, int], str] = {}
    for d, dirs, files in os.walk(src):  # a loop per folder and per file of a small table
        here = dest / os.path.relpath(d, src)
        here.mkdir(parents=True, exist_ok=True)
        for name in files:
            s, t = os.path.join(d, name), os.path.join(here, name)
            st = os.lstat(s)
            if os.path.islink(s):
                os.symlink(os.readlink(s), t)
            elif (st.st_dev, st.st_ino) in first:
                os.link(first[(st.st_dev, st.st_ino)], t)
            else:
                shutil.copy2(s, t)
                first[(st.st_dev, st.st_ino)] = t


class WrittenOnce:
    """The tables of one test class, each distinct ``(rows, keys)`` written once (a save took
    30-70 ms of CPU and a second of fsyncs under load; a copy 5 ms, an open 1-2 ms).

    ``write(dest, array, keys)`` writes a table; ``home()`` is a new place for each one
    written.  :meth:`place` gives where a test's table opens with ``mode``: read-only opens
    share the written table (they write nothing), writable ones get a ``copy(src, dest)``
    of it at ``fresh()``, or without ``copy`` a table written afresh there.
    """

    def __init__(self, write: Callable[[Any, np.ndarray, Any], None], home: Callable[[], Any],
                 copy: Callable[[Any, Any], None] | None = None):
        self.write, self.home, self.copy = write, home, copy
        self.written: dict[tuple, Any] = {}

    def place(self, array: np.ndarray, keys, mode: str, fresh: Callable[[], Any]):
        array = np.ascontiguousarray(array)
        if mode != "r" and self.copy is None:
            dest = fresh()
            self.write(dest, array, keys)
            return dest
        what = (array.dtype.str, array.shape, array.tobytes(),
                None if keys is None else tuple(keys))
        if what not in self.written:
            self.written[what] = self.home()
            self.write(self.written[what], array, keys)
        if mode == "r":
            return self.written[what]
        dest = fresh()
        self.copy(self.written[what], dest)
        return dest


def saver(layout: dict, storage_dtype: str) -> tuple[Callable[[Any, np.ndarray, Any], None], Any]:
    """``(save, cache_bytes)``: ``save(dest, array, keys)`` writes a table by ``embstore.save``
    with ``layout`` (less ``cache_bytes``, the reader's row cache, returned beside it)."""
    kw = dict(layout)
    cache = kw.pop("cache_bytes", "1MiB")

    def save(dest, array, keys) -> None:
        embstore.save(dest, np.ascontiguousarray(array), keys=keys, dtype=storage_dtype,
                      **kw).close()
    return save, cache


def saving_factory(where: Callable[[], Any], *, layout: dict, storage_dtype: str,
                   fixed_mode: str | None = None, once: WrittenOnce | None = None):
    """``(make, opened)``: ``make`` writes rows by ``embstore.save`` to ``where()`` (a new
    path or URL each call) with ``layout`` (``cache_bytes`` among it: the reader's cache),
    then opens them; ``opened`` lists the tables, to close.  With ``once`` (the class's
    :class:`WrittenOnce`, writing with the same layout), rows and keys seen before in the
    class are not saved again."""
    save, cache = saver(layout, storage_dtype)
    opened: list = []

    def make(array, keys=None, mode="r+"):
        mode = fixed_mode or mode
        if once is None:
            dest = where()
            save(dest, array, keys)
        else:
            dest = once.place(array, keys, mode, where)
        t = embstore.open(dest, mode=mode, cache_bytes=cache)
        opened.append(t)
        return t

    return make, opened


class SavedTables(TableContract):
    """Tables written by ``embstore.save`` to a local directory with ``layout`` (keyword
    arguments of ``save``; ``cache_bytes`` is the reader's row cache); each distinct table
    saved once per class (:class:`WrittenOnce`)."""

    layout: dict = {}

    @pytest.fixture(scope="class")
    @classmethod
    def written_once(cls, tmp_path_factory) -> WrittenOnce:
        home = tmp_path_factory.mktemp("saved")
        names = itertools.count()
        return WrittenOnce(saver(cls.layout, cls.storage_dtype)[0],
                           lambda: home / f"t{next(names)}", copy_tree)

    @pytest.fixture
    def make_table(self, tmp_path: Path, written_once):
        names = itertools.count()
        make, opened = saving_factory(lambda: tmp_path / f"table{next(names)}",
                                      layout=self.layout, storage_dtype=self.storage_dtype,
                                      once=written_once)
        yield make
        for t in opened:
            t.close()
