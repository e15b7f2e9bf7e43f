"""Id validation, written once for every backend.

``as_ids(ids, vocab_size)`` turns anything the contract calls an id array
(a Python int, a list, an N-D NumPy array of any integer dtype) into an int64
array of the same shape, or raises :class:`InvalidIdError` naming the first bad
id and its position.  It makes one min/max pass and no copy when the ids are
already int64 (or intp) and valid.

Array subclasses are converted to plain arrays first: ``np.matrix`` (whose reshape stays
2-D) and ``np.memmap`` become ``ndarray`` views; a masked array is refused when anything
is masked (its ``min``/``max`` skip masked elements, which would let any value through).
``row_bytes`` makes it refuse, before scanning a single id, a result that could never fit
in this machine's memory (a broadcast of 2**40 ids).

The argument validators every module shares live here too: :func:`positive_int`,
:func:`non_negative_int` and :func:`one_of` (messages ``NAME must be a positive int,
got VALUE`` and ``NAME must be one of 'a', 'b', got VALUE``).
"""

from __future__ import annotations

import numbers
import operator
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

try:
    import resource
except ImportError:  # (Windows)
    resource = None  # type: ignore[assignment]

from .errors import (InvalidIdError, InvalidOptionError, KeyNotFoundError, ResultTooLargeError,
                     ShapeMismatchError)

__all__ = ["unique_ints", "as_ids", "position_of", "check_result_size", "alloc_result", "check_out",
           "memory_refused",
           "result_refused", "parse_bytes", "positive_int", "non_negative_int", "one_of",
           "is_int", "check_like_ids", "as_key_array"]

_INT64_MAX = np.iinfo(np.int64).max
MAX_ID_DIMS = 64  # NumPy's limit on dimensions (numpy 2; 32 before)


def is_int(value: object) -> bool:
    """A Python or NumPy integer that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def positive_int(value: object, name: str, *,
                 error: type[Exception] = InvalidOptionError) -> int:
    """``int(value)`` if ``value`` is an integer >= 1, else ``error`` naming ``name``."""
    if not is_int(value) or value < 1:  # type: ignore[operator]
        raise error(f"{name} must be a positive int, got {value!r}")
    return int(value)  # type: ignore[call-overload]


def non_negative_int(value: object, name: str, *,
                     error: type[Exception] = InvalidOptionError) -> int:
    """``int(value)`` if ``value`` is an integer >= 0, else ``error`` naming ``name``."""
    if not is_int(value) or value < 0:  # type: ignore[operator]
        raise error(f"{name} must be an int >= 0, got {value!r}")
    return int(value)  # type: ignore[call-overload]


def one_of(value: object, name: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of the strings ``choices``, else a :class:`ValueError`."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidOptionError(f"{name} must be one of {', '.join(map(repr, choices))}, "
                                 f"got {value!r}")
    return value


def check_like_ids(value, shape, name: str) -> np.ndarray:
    """``value`` as an array of the shape of the ids (a mask, weights), or
    :class:`ShapeMismatchError` naming ``name``."""
    arr = np.asarray(value)
    if arr.shape != tuple(shape):
        raise ShapeMismatchError(
            f"{name} must have the shape of ids {tuple(shape)}, got {arr.shape}")
    return arr


def position_of(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The index tuple of element ``flat_index`` of a C-ordered array of ``shape``."""
    if shape == ():
        return ()
    return tuple(int(i) for i in np.unravel_index(int(flat_index), shape))


def at_position(pos: tuple[int, ...], shape: tuple[int, ...]) -> str:
    """`` at position (i, j)`` for a message, or nothing when the ids are a single one."""
    return "" if int(np.prod(shape, dtype=np.int64)) <= 1 else f" at position {pos}"


_KEYS_HINT = " (row ids are integers; look keys up with lookup_keys([...]))"


def _bad_type(ids, arr=None, kind=None) -> InvalidIdError:
    if arr is not None and arr.size:
        first = arr.reshape(-1)[0]
        pos = position_of(0, arr.shape)
        hint = _KEYS_HINT if isinstance(first, str) or arr.dtype.kind == "U" else ""
        return InvalidIdError(
            f"ids must be integers, got {kind or arr.dtype} (first id {first!r}"
            f"{at_position(pos, arr.shape)}){hint}",
            id=first, position=pos)
    hint = _KEYS_HINT if isinstance(ids, str) else ""
    return InvalidIdError(f"ids must be integers, got {kind or type(ids).__name__}: "
                          f"{ids!r}{hint}", id=ids, position=())


def _plain(ids: np.ndarray) -> np.ndarray:
    """An ``ndarray`` subclass as a plain ``ndarray`` (masked arrays: only if nothing is masked)."""
    if isinstance(ids, np.ma.MaskedArray):
        mask = np.ma.getmask(ids)
        if mask is not np.ma.nomask and mask.any():
            i = int(np.argmax(np.asarray(mask).reshape(-1)))
            pos = position_of(i, ids.shape)
            raise InvalidIdError(f"masked ids are not supported: the id at position {pos} is "
                                 "masked (fill masked ids first, e.g. ids.filled(0))",
                                 id=None, position=pos)
        return np.asarray(ids.data).view(np.ndarray)
    return ids.view(np.ndarray)


def _memory_bytes() -> int:
    global _MEMORY
    if _MEMORY is None:
        try:
            _MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            _MEMORY = 1 << 62
    return _MEMORY


_MEMORY: int | None = None


def _limit() -> tuple[int, str]:
    """The bytes a result may take and what sets it: the machine's memory, or the process's
    address space limit (``RLIMIT_AS``, ``ulimit -v``) when it is lower."""
    have, what = _memory_bytes(), "this machine's"
    if resource is not None:
        try:
            soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        except (OSError, ValueError):
            soft = resource.RLIM_INFINITY
        if soft != resource.RLIM_INFINITY and 0 < soft < have:
            have, what = soft, "the process's address space limit (RLIMIT_AS) of"
    return have, what


def check_result_size(n_ids: int, row_bytes: int) -> None:
    """Refuse a lookup result of ``n_ids`` rows of ``row_bytes`` larger than the machine."""
    need = int(n_ids) * int(row_bytes)
    have, what = _limit()
    if need > have:
        raise ResultTooLargeError(
            f"{n_ids} ids of {row_bytes}-byte rows make a {need}-byte result, more than "
            f"{what} {have} bytes of memory (look them up in blocks, or pass out=)")


def alloc_result(shape, dtype) -> np.ndarray:
    """``np.empty(shape, dtype)``; an allocation the system refuses is a
    :class:`ResultTooLargeError` naming its size, not NumPy's ``MemoryError``."""
    try:
        return np.empty(shape, dtype=dtype)
    except MemoryError:
        raise result_refused(shape, dtype) from None


def check_out(out, want: tuple[int, ...], dtype) -> np.ndarray:
    """A lookup's result buffer: ``out`` checked (shape ``want``, ``dtype``, writeable,
    C-contiguous), or a new one when ``out`` is None."""
    if out is None:
        return alloc_result(want, dtype)
    if not isinstance(out, np.ndarray):
        out = _tensor_memory(out)
    if out.shape != want or out.dtype != dtype:
        raise ShapeMismatchError(
            f"out must have shape {want} and dtype {dtype}, got shape {out.shape} "
            f"and dtype {out.dtype}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ShapeMismatchError("out must be a writeable C-contiguous array")
    return out


def _tensor_memory(out) -> np.ndarray:
    """A CPU torch tensor (pinned or not) given as ``out``: the NumPy array over its memory
    (torch is not imported: a tensor is recognised by its type's module)."""
    if type(out).__module__.partition(".")[0] != "torch" or not hasattr(out, "numpy"):
        raise ShapeMismatchError(f"out must be a NumPy array or a CPU torch tensor, got "
                                 f"{type(out).__name__}")
    if out.device.type != "cpu" or out.requires_grad or not out.is_contiguous():
        raise ShapeMismatchError("a torch tensor as out must be on the CPU (pinned or not), "
                                 "contiguous and not require grad")
    try:
        return out.numpy()
    except TypeError:  # a dtype NumPy lacks (bfloat16)
        raise ShapeMismatchError(f"out of dtype {out.dtype}: NumPy has no such dtype (give "
                                 "a float32 tensor)") from None


@contextmanager
def memory_refused(shape, dtype) -> Iterator[None]:
    """NumPy's ``MemoryError`` inside as :func:`result_refused` for a result of ``shape``."""
    try:
        yield
    except ResultTooLargeError:
        raise
    except MemoryError:
        raise result_refused(shape, dtype) from None


def result_refused(shape, dtype) -> ResultTooLargeError:
    """The error for a result of ``shape`` whose memory the system refused."""
    need = int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
    have, what = _limit()
    return ResultTooLargeError(
        f"a result of shape {tuple(shape)} ({need} bytes) cannot be allocated: the system "
        f"refused the memory ({what} {have} bytes; look the ids up in blocks, or pass out=)")


def _to_array(ids) -> np.ndarray:
    if isinstance(ids, np.ndarray):
        return ids if type(ids) is np.ndarray else _plain(ids)
    if isinstance(ids, (bool, np.bool_)):
        raise _bad_type(ids, kind="bool")
    if isinstance(ids, numbers.Integral):
        try:
            return np.asarray(operator.index(ids), dtype=np.int64)
        except OverflowError:
            raise InvalidIdError(f"id {ids} is out of range", id=ids,
                                 position=()) from None
    if isinstance(ids, (str, bytes, float, complex, numbers.Real)):
        raise _bad_type(ids)
    try:
        arr = np.asarray(ids)
    except (OverflowError, ValueError) as exc:  # ragged lists, Python ints beyond int64
        if isinstance(exc, OverflowError) or "int" in str(exc):
            return _python_int_array(ids)
        raise InvalidIdError(f"ids must form a rectangular integer array: {exc}", id=None,
                             position=None) from None
    if arr.dtype.kind in "OUSb" or (arr.dtype.kind == "f" and arr.size):
        return _python_int_array(ids)  # mixed lists: name the first element that is no int
    if arr.size == 0 and arr.dtype.kind == "f":  # an empty list
        return arr.astype(np.int64)
    if arr.dtype.kind in "iu" and _holds_bool(ids):  # [1, True] becomes [1, 1] in NumPy
        return _python_int_array(ids)
    return arr


def _holds_bool(seq) -> bool:
    """Whether a (nested) list or tuple holds a Python or NumPy bool."""
    stack = [seq]
    while stack:
        s = stack.pop()
        for v in s:
            if isinstance(v, (list, tuple)):
                stack.append(v)
            elif isinstance(v, (bool, np.bool_)):
                return True
    return False


def _python_int_array(ids) -> np.ndarray:
    """Lists holding huge Python ints or mixed objects: find the first offender."""
    try:
        obj = np.asarray(ids, dtype=object)
    except ValueError as exc:
        raise InvalidIdError(f"ids must form a rectangular integer array: {exc}", id=None,
                             position=None) from None
    flat = obj.reshape(-1)
    for i, v in enumerate(flat):  # error path only: the array is already not integer-typed
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
            pos = position_of(i, obj.shape)
            raise InvalidIdError(
                f"ids must be integers, got {type(v).__name__} {v!r}{at_position(pos, obj.shape)}"
                + (_KEYS_HINT if isinstance(v, str) else ""),
                id=v, position=pos)
        if int(v) < 0 or int(v) > _INT64_MAX:
            pos = position_of(i, obj.shape)
            raise InvalidIdError(f"id {v}{at_position(pos, obj.shape)} is out of range", id=v,
                                 position=pos)
    return obj.astype(np.int64)


def as_key_array(keys) -> np.ndarray:
    """Keys of any shape as an object array of ``str`` (a bare ``str`` gives shape ())."""
    if isinstance(keys, str):
        out = np.empty((), dtype=object)
        out[()] = keys
        return out
    arr = np.asarray(keys, dtype=object) if not isinstance(keys, np.ndarray) else keys
    if arr.dtype.kind in "US":
        arr = arr.astype(object)
    elif arr.dtype != object:
        raise KeyNotFoundError(f"keys must be strings, got an array of {arr.dtype}",
                               key=None, position=None)
    flat = arr.reshape(-1)
    if flat.size and set(map(type, flat.tolist())) != {str}:  # (map: a C loop, 3x a genexpr)
        is_str = np.fromiter((type(k) is str for k in flat), dtype=bool, count=flat.size)
        if not is_str.all():
            i = int(np.argmin(is_str))
            v, pos = flat[i], position_of(i, arr.shape)
            if not isinstance(v, str):  # str subclasses are fine
                raise KeyNotFoundError(f"keys must be strings, got {type(v).__name__} {v!r}"
                                       f"{at_position(pos, arr.shape)}", key=v, position=pos)
    return arr


def key_list(keys) -> list[str]:
    """Keys of any shape as a flat list of plain ``str`` (as :func:`as_key_array` checks
    them); a list or tuple of plain strings is taken as it is (one C-level type check)."""
    if isinstance(keys, (list, tuple)) and keys and set(map(type, keys)) == {str}:
        return list(keys)
    return list(map(str, as_key_array(keys).reshape(-1)))


def as_ids(ids, vocab_size: int, *, row_bytes: int = 0) -> np.ndarray:
    """Validate ``ids`` against ``0 <= id < vocab_size``; return int64 of the same shape.

    With ``row_bytes``, first refuse ids whose result (``ids.size`` rows) cannot fit in
    memory, with :class:`~embstore.errors.ResultTooLargeError`.
    """
    arr = _to_array(ids)
    if arr.ndim >= MAX_ID_DIMS:  # the rows add a dimension: NumPy's error came from there
        raise InvalidIdError(f"ids of {arr.ndim} dimensions: at most {MAX_ID_DIMS - 1} (the "
                             f"result adds one for the vectors, and NumPy arrays have at "
                             f"most {MAX_ID_DIMS}); reshape the ids", id=None)
    if row_bytes:
        check_result_size(arr.size, row_bytes)
    kind = arr.dtype.kind
    if kind not in "iu":
        raise _bad_type(ids, arr, kind=str(arr.dtype))
    if arr.size == 0:
        return arr.astype(np.int64, copy=False)
    lo = arr.min()
    hi = arr.max()
    if lo < 0 or hi >= vocab_size:
        flat = arr.reshape(-1)
        bad = (flat < 0) | (flat >= vocab_size)
        i = int(np.argmax(bad))
        pos = position_of(i, arr.shape)
        v = flat[i].item()
        raise InvalidIdError(
            f"id {v}{at_position(pos, arr.shape)} is out of range for a table of {vocab_size} "
            f"rows (valid ids: 0..{vocab_size - 1})" if vocab_size else
            f"id {v}{at_position(pos, arr.shape)} is out of range: the table has no rows",
            id=v, position=pos, vocab_size=vocab_size)
    if arr.dtype == np.int64:
        return arr
    return arr.astype(np.int64)


# -- shared validators ----------------------------------------------------------------------
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
          "tb": 1000**4, "tib": 1024**4}
#: The largest byte size accepted (4 EiB): more is a typing mistake, not a budget.
MAX_BYTES = 1 << 62


def parse_bytes(value) -> int:
    """``256``, ``"256MiB"``, ``"1GB"``, ``"1.5 GiB"`` -> bytes (1 KB = 1000 B, 1 KiB = 1024 B).

    Anything else (``"1XB"``, ``-5``, a float, more than 4 EiB) raises
    :class:`~embstore.errors.InvalidOptionError` (a ``ValueError``).
    """
    if isinstance(value, (bool, np.bool_)):
        raise InvalidOptionError(
            f"a byte size must be an int or a string like '256MiB', got {value!r}")
    if isinstance(value, (int, np.integer)):
        n = int(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise InvalidOptionError(f"cannot read {value!r} as a byte size (examples: 0, "
                                     "1048576, '256MiB', '1GB')")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise InvalidOptionError(
            f"a byte size must be an int or a string like '256MiB', got {value!r}")
    if n < 0:
        raise InvalidOptionError(f"a byte size must be >= 0, got {value!r}")
    if n > MAX_BYTES:
        raise InvalidOptionError(f"a byte size must be at most {MAX_BYTES} (4 EiB), got "
                                 f"{value!r}")
    return n


def unique_ints(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of the 1-D integer array ``a``: ``np.unique`` without its
    first-call import of ``numpy.ma`` (6-38 ms of a fresh process's first lookup)."""
    if a.size < 2:
        return a.copy()
    s = np.sort(a)
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def refuse_existing(found: np.ndarray, keys: list[str]) -> None:
    """ShapeMismatchError naming the first of the keys an append adds that the table holds
    already (``found``: their rows in its vocabulary, -1 where absent)."""
    if (found >= 0).any():
        i = int(np.argmax(found >= 0))
        raise ShapeMismatchError(f"append: key {keys[i]!r} already exists at row {int(found[i])}")
