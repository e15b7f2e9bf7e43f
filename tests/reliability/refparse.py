"""Independent reference readers for the fuzz oracle: small, obvious, slow.

When ``embstore import`` accepts a malformed file, the table must hold what these readers
(or NumPy, safetensors' own header rules, ``torch.load(weights_only=True)``) find in the
same bytes.  They raise :class:`Refused` where the file is not a valid file of its format.
None of them shares code with embstore.
"""

from __future__ import annotations

import io
import json
import math
import struct

import numpy as np


class Refused(Exception):
    """The reference reader refuses the file."""


def _num(tok: bytes) -> float | None:
    if b"_" in tok:
        return None
    try:
        return float(tok)
    except ValueError:
        return None


def _dedup(keys: list[str], rows: list) -> tuple[list[str], list]:
    seen: set[str] = set()
    out_k, out_r = [], []
    for k, r in zip(keys, rows):
        if k not in seen:
            seen.add(k)
            out_k.append(k)
            out_r.append(r)
    return out_k, out_r


def _to_f32(rows: list[list[float]], dim: int) -> np.ndarray:
    arr = np.array(rows, dtype=np.float64).reshape(len(rows), dim)
    with np.errstate(over="ignore"):
        out = arr.astype(np.float32)
    if not np.isfinite(out).all():
        raise Refused("a value overflows float32")
    return out


def text(data: bytes, *, header: bool) -> tuple[list[str], np.ndarray]:
    """word2vec/fastText (``header``) or GloVe text: ``(keys, float32 rows)``."""
    lines = data.split(b"\n")
    lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise Refused("empty")
    if header:
        toks = lines[0].split()
        if len(toks) != 2 or not all(t.isdigit() for t in toks):
            raise Refused("header")
        count, dim = int(toks[0]), int(toks[1])
        body = lines[1:]
        if dim < 1 or len(body) != count:
            raise Refused("count")
    else:
        toks = lines[0].split()
        numeric = 0
        for t in reversed(toks):
            if _num(t) is None:
                break
            numeric += 1
        dim = min(numeric, len(toks) - 1)
        if dim < 1:
            raise Refused("first line")
        body = lines
    keys, rows = [], []
    for line in body:
        toks = line.split()
        if not toks:
            raise Refused("empty line")
        if len(toks) - 1 > dim and _num(toks[-dim - 1]) is None:
            key = line.strip().rsplit(None, dim)[0]
            vals = toks[-dim:]
        elif len(toks) - 1 == dim:
            key, vals = toks[0], toks[1:]
        else:
            raise Refused("ragged")
        nums = [_num(v) for v in vals]
        if any(x is None or not math.isfinite(x) for x in nums):
            raise Refused("value")
        try:
            keys.append(key.decode("utf-8"))
        except UnicodeDecodeError:
            raise Refused("utf-8") from None
        rows.append(nums)
    keys, rows = _dedup(keys, rows)
    return keys, _to_f32(rows, dim)


def word2vec_binary(data: bytes) -> tuple[list[str], np.ndarray]:
    """The C tool's binary format (keys without spaces): ``(keys, float32 rows)``."""
    nl = data.find(b"\n")
    if nl < 0:
        raise Refused("header")
    toks = data[:nl].split()
    if len(toks) != 2 or not all(t.isdigit() for t in toks):
        raise Refused("header")
    count, dim = int(toks[0]), int(toks[1])
    if dim < 1:
        raise Refused("dim")
    pos = nl + 1
    keys, rows = [], []
    for _ in range(count):
        while pos < len(data) and data[pos] == 10:
            pos += 1
        sp = data.find(b" ", pos)
        if sp < 0 or sp + 1 + 4 * dim > len(data):
            raise Refused("truncated")
        try:
            keys.append(data[pos:sp].decode("utf-8"))
        except UnicodeDecodeError:
            raise Refused("utf-8") from None
        vec = np.frombuffer(data, dtype="<f4", count=dim, offset=sp + 1)
        if not np.isfinite(vec).all():
            raise Refused("non-finite")
        rows.append(vec)
        pos = sp + 1 + 4 * dim
    if data[pos:].strip():
        raise Refused("trailing bytes")
    keys, rows = _dedup(keys, rows)
    return keys, np.array(rows, dtype=np.float32).reshape(len(rows), dim)


def npy(data: bytes) -> np.ndarray:
    """NumPy's own reader (no pickle), then the 2-D float check."""
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any refusal by NumPy
        raise Refused(str(exc)) from None
    if not isinstance(arr, np.ndarray) or arr.ndim != 2 or arr.dtype.kind != "f" or \
            arr.shape[1] < 1 or not np.isfinite(arr).all():
        raise Refused("not a 2-D finite float array")
    return arr


_ST = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "BF16": "<u2"}
_ST_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4,
            "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def safetensors(data: bytes, name: str) -> np.ndarray:
    """Tensor ``name`` read straight from the bytes after checking the whole header:
    shapes, dtypes and offsets inside the data, no two tensors overlapping."""
    if len(data) < 8:
        raise Refused("short")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise Refused("header length")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError:
        raise Refused("json") from None
    if not isinstance(header, dict):
        raise Refused("not an object")
    header.pop("__metadata__", None)
    size = len(data) - 8 - n
    spans = []
    for info in header.values():
        if not isinstance(info, dict):
            raise Refused("entry")
        dt, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dt, str) or dt not in _ST_SIZE or not isinstance(shape, list) or \
                not all(type(s) is int and s >= 0 for s in shape) or not isinstance(offs, list) \
                or len(offs) != 2 or not all(type(o) is int for o in offs):
            raise Refused("entry fields")
        b, e = offs
        if not 0 <= b <= e <= size or e - b != _ST_SIZE[dt] * math.prod(shape):
            raise Refused("offsets")
        spans.append((b, e))
    spans.sort()
    for (_, e0), (b1, _) in zip(spans, spans[1:]):
        if b1 < e0:
            raise Refused("overlap")
    info = header.get(name)
    if info is None or info["dtype"] not in _ST or len(info["shape"]) != 2 or \
            info["shape"][1] < 1:
        raise Refused("no such 2-D float tensor")
    b, e = info["data_offsets"]
    raw = np.frombuffer(data[8 + n + b: 8 + n + e], dtype=_ST[info["dtype"]])
    if info["dtype"] == "BF16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    arr = raw.reshape(info["shape"])
    if not np.isfinite(arr).all():
        raise Refused("non-finite")
    return arr


def torch_tensor(path, name: str) -> np.ndarray:
    """Tensor ``name`` (dotted) of a PyTorch file read with ``torch.load(weights_only=True)``."""
    import torch

    try:  # torch reads storages lazily when memory-mapped: an unused damaged one may pass
        obj = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except Exception as exc:  # noqa: BLE001 - any refusal by torch
        raise Refused(str(exc)) from None
    for part in name.split(".") if name != "tensor" else []:
        obj = obj[int(part) if isinstance(obj, (list, tuple)) else part]
    t = obj.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()
