"""The Table contract (tests/contract.py) on MemoryTable, each local layout, each storage dtype.

One subclass per backend; what it declares is all that differs (see tests/contract.py on
adding one).
"""

from __future__ import annotations

import numpy as np
import pytest
from contract import ROUND_TRIPS, SavedTables, TableContract

import embstore
from embstore.dtypes import DTYPES
from embstore.store.shard import arena
from embstore.store.writer import rows_layout


class TestMemoryTable(TableContract):
    @pytest.fixture
    def make_table(self):
        def make(array, keys=None, mode="r+"):
            t = embstore.MemoryTable(np.array(array), keys=keys)
            if mode == "r":
                t.array.flags.writeable = False
            return t
        return make


# -- local layouts (float32) ----------------------------------------------------------------
class TestZarr(SavedTables):
    layout = {}


class TestZarrSmallChunks(SavedTables):
    layout = {"chunk_rows": 4, "shard_rows": 16}


class TestZarrZstd(SavedTables):
    layout = {"compression": "zstd", "chunk_rows": 8, "shard_rows": 32}


class TestZarrBloscNoCache(SavedTables):
    layout = {"compression": "blosc", "chunk_rows": 8, "shard_rows": 32, "cache_bytes": 0}


# -- storage dtypes: lookups compare against the dtype's own round trip (contract.ROUND_TRIPS)
class TestFloat64(SavedTables):
    storage_dtype = "float64"


class TestFloat16(SavedTables):
    storage_dtype = "float16"
    rtol, atol = 2.0**-11, 2.0**-25  # half a unit in the last place; subnormals


class TestBfloat16(SavedTables):
    storage_dtype = "bfloat16"
    rtol = 2.0**-8


class TestInt8(SavedTables):
    storage_dtype = "int8"
    row_steps = 0.5  # half a quantisation step


class TestInt8SmallChunksZstd(TestInt8):
    layout = {"compression": "zstd", "chunk_rows": 4, "shard_rows": 16}


# format 2's row arrays (docs/FORMAT.md: rows at a fixed stride, a crc32c per 4 KiB page) are
# the default layout where the system maps them, so TestZarr, TestInt8 and TestBfloat16 above
# run on them; only where they are not the default do they need classes of their own.
if not arena.available():
    class TestFormat2(SavedTables):
        layout = {"format_version": 2}

    class TestFormat2Int8(TestInt8):
        layout = {"format_version": 2}

    class TestFormat2Bfloat16(TestBfloat16):
        layout = {"format_version": 2}


def test_the_default_layout_is_the_row_array_where_it_maps():
    """The premise of running the row array through the default classes above."""
    assert rows_layout(64, None, None, "none", None) is arena.available()
    assert rows_layout(64, None, None, "none", 2) is True


def test_every_storage_dtype_runs_the_contract():
    """A storage dtype added to embstore.dtypes.DTYPES needs its own round trip, written
    independently of embstore, in contract.ROUND_TRIPS, and a subclass above."""
    here = {c.storage_dtype for c in globals().values()
            if isinstance(c, type) and issubclass(c, SavedTables) and c.__name__[:4] == "Test"}
    assert sorted(here) == sorted(ROUND_TRIPS) == sorted(DTYPES)


# -- not backends: the functional form and MemoryTable's wrapping --------------------------
def test_functional_form(rng):
    E = rng.standard_normal((37, 5)).astype(np.float32)
    ids = rng.integers(0, 37, size=(2, 3))
    np.testing.assert_array_equal(embstore.embedding_lookup(E, ids), E[ids])
    t = embstore.MemoryTable(E)
    np.testing.assert_array_equal(embstore.embedding_lookup(t, ids), E[ids])


def test_memory_table_wraps_without_copy(rng):
    E = rng.standard_normal((37, 5)).astype(np.float32)
    t = embstore.MemoryTable(E)
    assert np.shares_memory(t.array, E)
