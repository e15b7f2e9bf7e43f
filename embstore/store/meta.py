"""Checks of a table's metadata before anything is sized, opened or read by it.

``zarr.json`` files are untrusted input: a hostile or damaged one must give a clean
:class:`~embstore.errors.CorruptStoreError`, never a path outside the table, an
allocation sized by a huge shape, a division by zero or a foreign exception.  The rules
are those of docs/FORMAT.md that every reader relies on; a layout the fast path does not
know (other codecs) still passes here and is read by zarr-python.
"""

from __future__ import annotations

import json
import re
import os
import stat
import uuid
from pathlib import Path
from typing import TypeGuard

from ..dtypes import STORAGE_DTYPES
from ..errors import (CorruptStoreError, FormatError, NotATableError, ResourceLimitError,
                      TableNotFoundError)
from ..fs import atomic
from ..fs.files import MAX_JSON_BYTES, link_below, open_regular, read_small

FORMATS = (1, 2)  # what this version reads (docs/FORMAT.md); new tables: 2

__all__ = ["table_id", "FORMATS", "check_group_meta", "check_vectors_meta", "read_json", "read_table_meta",
           "unsafe_files", "MAX_INNER_CHUNKS", "MAX_DIM", "MAX_JSON_BYTES", "write_json",
           "replace_json", "set_data_type", "set_rows"]

MAX_INNER_CHUNKS = 1 << 24  # inner chunks per shard: an index of at most 256 MiB
MAX_BYTES = 1 << 60  # logical bytes of a table
MAX_DIM = 1 << 28  # values per row (a 2 GiB float64 row)
MAX_CODEC_MEMORY = 1 << 30  # a codec's own buffers (lzma's dict_size): what xz input may use
_MEMORY_FIELDS = ("dict_size", "dictsize", "window_size", "blocksize", "block_size")


def _codec_memory(node) -> tuple[str, int] | None:
    """The first memory-sizing field (lzma's ``dict_size``, a window or block size) of any
    codec configuration in ``node`` (nested filters and sharding codecs too) that passes
    ``MAX_CODEC_MEMORY``: decoders allocate them before reading a byte."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in _MEMORY_FIELDS and _is_int(v) and v > MAX_CODEC_MEMORY:
                return k, int(v)
            found = _codec_memory(v)
            if found is not None:
                return found
    elif isinstance(node, list):
        for v in node:
            found = _codec_memory(v)
            if found is not None:
                return found
    return None


def _is_int(x) -> bool:
    return type(x) is int  # JSON integers only: not true/false, not 4.0


def _positive_ints(value: object, n: int) -> TypeGuard[list[int]]:
    return isinstance(value, list) and len(value) == n and all(
        _is_int(v) and v >= 1 for v in value)


def check_group_meta(group: dict, where) -> dict:
    """The ``embstore`` attributes of a group ``zarr.json`` (``{}`` if it has none)."""
    if group.get("node_type") != "group" or group.get("zarr_format") != 3:
        raise FormatError("not an embstore table: zarr.json is not a Zarr v3 group",
                          path=str(where))
    attributes = group.get("attributes", {})
    if not isinstance(attributes, dict):
        raise CorruptStoreError(f"{where}: the group's attributes must be a JSON object, got "
                                f"{type(attributes).__name__}", path=str(where))
    attrs = attributes.get("embstore") or {}
    if not isinstance(attrs, dict):
        raise CorruptStoreError(f"{where}: attributes.embstore must be a JSON object, got "
                                f"{type(attrs).__name__}", path=str(where))
    if attrs and (not _is_int(attrs.get("format")) or attrs.get("format") not in FORMATS):
        raise FormatError(f"embstore format {attrs.get('format')!r} is not supported "
                          "(this version reads formats 1 and 2)", path=str(where))
    return attrs


def check_vectors_meta(meta: dict, where, attrs: dict | None = None) -> None:
    """Raise :class:`CorruptStoreError` unless ``vectors/zarr.json`` describes a sane table:
    a Zarr v3 array of shape ``(rows >= 0, 1 <= dim <= MAX_DIM)``, a storage data type (float16/32/64, bfloat16, int8), a
    regular chunk grid, chunk keys ``c/<k>/0`` (separator ``/`` or ``.``), and, when sharded,
    inner chunks dividing the shard, at most ``MAX_INNER_CHUNKS`` of them; ``dim`` and
    ``dtype`` as the group's ``attrs`` (the ``embstore`` attributes) record them."""
    def bad(what: str):
        return CorruptStoreError(f"{where}: {what}", path=str(where))

    if meta.get("node_type") != "array" or meta.get("zarr_format") != 3:
        raise bad(f"expected a Zarr v3 array, got node_type {meta.get('node_type')!r}, "
                  f"zarr_format {meta.get('zarr_format')!r}")
    shape = meta.get("shape")
    if not (isinstance(shape, list) and len(shape) == 2 and all(_is_int(s) for s in shape)
            and shape[0] >= 0 and shape[1] >= 1):
        raise bad(f"expected shape [rows >= 0, dim >= 1], got {shape!r}")
    rows, dim = shape
    dtype = meta.get("data_type")
    if dtype not in STORAGE_DTYPES:
        raise bad(f"expected data_type one of {', '.join(STORAGE_DTYPES)}, got {dtype!r}")
    if dim > MAX_DIM or rows * dim * 8 > MAX_BYTES:
        raise bad(f"shape {shape} is beyond any table (rows of at most {MAX_DIM} values, "
                  f"{MAX_BYTES} bytes in all)")
    if attrs is not None:  # what the writer recorded in the group must agree
        for key, value in (("dim", dim), ("dtype", dtype)):
            if key in attrs and attrs[key] != value:
                raise bad(f"{key} {value!r} disagrees with the group's attributes "
                          f"({key} {attrs[key]!r})")
    grid = meta.get("chunk_grid")
    chunks = grid.get("configuration", {}).get("chunk_shape") if isinstance(grid, dict) else None
    if not (isinstance(grid, dict) and grid.get("name") == "regular"
            and _positive_ints(chunks, 2)):
        raise bad(f"expected a regular chunk grid [rows, columns], got {grid!r}")
    cke = meta.get("chunk_key_encoding")
    conf = cke.get("configuration", {}) if isinstance(cke, dict) else None
    if not (isinstance(cke, dict) and isinstance(conf, dict) and cke.get("name") == "default"
            and conf.get("separator", "/") in ("/", ".")):
        raise bad(f"expected chunk key encoding 'default' with separator '/' or '.', got {cke!r}")
    codecs = meta.get("codecs")
    if not (isinstance(codecs, list) and codecs and all(
            isinstance(c, dict) and isinstance(c.get("name"), str) for c in codecs)):
        raise bad(f"expected a list of codecs, got {codecs!r}")
    if meta.get("storage_transformers"):
        raise bad(f"storage transformers are not supported, got {meta['storage_transformers']!r}")
    big = _codec_memory(codecs)
    if big is not None:
        raise bad(f"a codec asks for {big[1]} bytes of {big[0]} (at most {MAX_CODEC_MEMORY} "
                  "bytes: more than decoding any chunk of a table needs)")
    if codecs[0]["name"] == "sharding_indexed":
        sconf = codecs[0].get("configuration")
        inner = sconf.get("chunk_shape") if isinstance(sconf, dict) else None
        if not (_positive_ints(inner, 2) and chunks[0] % inner[0] == 0
                and chunks[1] % inner[1] == 0):
            raise bad(f"expected inner chunks dividing the shard {chunks}, got {inner!r}")
        n_inner = (chunks[0] // inner[0]) * (chunks[1] // inner[1])
        if n_inner > MAX_INNER_CHUNKS:
            raise bad(f"{n_inner} inner chunks per shard, more than {MAX_INNER_CHUNKS}")
        for key in ("codecs", "index_codecs"):
            sub = sconf.get(key)
            if not (isinstance(sub, list) and sub and all(
                    isinstance(c, dict) and isinstance(c.get("name"), str) for c in sub)):
                raise bad(f"expected a list of {key} in the sharding codec, got {sub!r}")


def read_json(path: Path, what: str, *, root: Path | None = None) -> dict:
    """A metadata file as a JSON object.  Never blocks: anything but a regular file (a
    FIFO), a file whose real path leaves ``root`` (the table's directory) or one larger
    than ``MAX_JSON_BYTES`` is refused with :class:`CorruptStoreError`."""
    try:
        fd = open_regular(path, root=root)
        try:
            raw = read_small(fd, path)
        finally:
            os.close(fd)
        doc = json.loads(raw.decode("utf-8"))  # bytes would be sniffed for UTF-16/32
    except FileNotFoundError:
        raise FormatError(f"not an embstore table: {what} is missing", path=str(path)) from None
    except (CorruptStoreError, ResourceLimitError):
        raise
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptStoreError(f"{path}: broken JSON ({exc})", path=str(path)) from None
    except (IsADirectoryError, NotADirectoryError) as exc:
        raise CorruptStoreError(f"{path}: cannot read ({exc.strerror})", path=str(path)) from None
    if not isinstance(doc, dict):
        raise CorruptStoreError(f"{path}: expected a JSON object", path=str(path))
    return doc


def unsafe_files(root: Path) -> list[tuple[str, str]]:
    """``(path, message)`` for every entry of the table at ``root`` that a reader must not
    open: not a regular file or directory (a FIFO blocks whoever opens it), or a symbolic
    link (out of the table: another table's files; inside it: another shard's rows).  Only ``lstat``/``stat``, never an ``open``."""
    found = []
    stack = [os.fspath(root)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError as exc:
            found.append((exc.filename or "", f"{exc.filename}: cannot list ({exc.strerror})"))
            continue
        for e in entries:
            try:
                if e.is_symlink():
                    found.append((e.path, link_below(e.path, root) or
                                  f"{e.path}: a symbolic link inside the table (refused)"))
                    continue
                elif e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                    continue
                else:
                    st_mode = e.stat(follow_symlinks=False).st_mode
            except OSError as exc:
                found.append((e.path, f"{e.path}: cannot inspect ({exc.strerror})"))
                continue
            if not (stat.S_ISREG(st_mode) or stat.S_ISDIR(st_mode)):
                found.append((e.path, f"{e.path}: expected a regular file, got a special "
                                      "file (a FIFO, socket or device)"))
    return found


def read_table_meta(path: Path) -> tuple[dict, dict]:
    """``(embstore attributes, vectors zarr.json)`` of the table at ``path``, checked."""
    if not path.is_dir():
        if path.exists():
            hint = (" (a .npy file opens as embstore.MemoryTable(np.load(path, mmap_mode='r')))"
                    if path.suffix.lower() == ".npy" else "")
            raise NotATableError("is a file, not an embstore table (a table is a directory "
                                 "written by save, create or import_file)" + hint,
                                 path=str(path), is_file=True)
        raise TableNotFoundError("no such table (no file or directory there)", path=str(path))
    if not (path / "zarr.json").exists():
        raise NotATableError("is a directory but not an embstore table (it has no zarr.json)",
                             path=str(path))
    attrs = check_group_meta(read_json(path / "zarr.json", "the group's zarr.json", root=path),
                             path)
    meta = read_json(path / "vectors" / "zarr.json", "vectors/zarr.json", root=path)
    check_vectors_meta(meta, path / "vectors" / "zarr.json", attrs)
    return attrs, meta


def refresh_consolidated(root: Path, staged: dict[str, Path]) -> dict | None:
    """The group ``zarr.json`` with its consolidated metadata brought up to date, or
    ``None`` when it has none (nothing to do).

    ``zarr.consolidate_metadata`` (what ``xarray.Dataset.to_zarr`` runs by default) copies
    each array's ``zarr.json`` into the group's; zarr-python and xarray then read shapes
    from that copy.  A commit that changes arrays (``staged``: live ``<array>/zarr.json``
    -> its new version) rebuilds the copy from the arrays' documents as they will be,
    new top-level arrays included, so every reader sees the same rows; when one cannot be
    read the copy is dropped instead (readers then list the arrays themselves).
    """
    group = staged.get("zarr.json", Path(root) / "zarr.json")
    doc = read_json(group, "the group's zarr.json", root=Path(root))
    cm = doc.get("consolidated_metadata")
    if cm is None:
        return None
    if not isinstance(cm, dict) or not isinstance(cm.get("metadata") or {}, dict):
        doc.pop("consolidated_metadata")
        return doc
    names = dict.fromkeys(cm.get("metadata") or {})
    names.update(dict.fromkeys(live[:-len("/zarr.json")] for live in staged
                               if live.endswith("/zarr.json") and live.count("/") == 1))
    members: dict[str, dict] = {}
    try:
        for name in names:
            src = staged.get(f"{name}/zarr.json", Path(root) / name / "zarr.json")
            members[name] = read_json(src, f"{name}/zarr.json", root=Path(root))
    except (FormatError, CorruptStoreError):
        doc.pop("consolidated_metadata")
        return doc
    doc["consolidated_metadata"] = {**cm, "metadata": members}
    return doc


# -- writing metadata documents ----------------------------------------------------------
def write_json(path, doc: dict, *, fsync: bool = True) -> None:
    """Write ``doc`` to the new file ``path`` (fsynced, unless the caller does it)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


def set_data_type(path: str, name: str) -> None:
    replace_json(path, lambda doc: doc.update(data_type=name))


def replace_json(path: str, update) -> None:
    """Edit a JSON file atomically (temporary file + rename)."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    update(doc)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    atomic.replace(tmp, path)


def set_rows(root: str, rows: int, name: str = "vectors", txn=None) -> None:
    """Set the row count of the array ``name`` at ``root``: stage its zarr.json with ``rows``
    rows in the transaction ``txn`` (fsynced with its other files), or without ``txn``
    replace it in place (temporary file + rename: a table being built, nobody reads it)."""
    def upd(doc):
        doc["shape"][0] = int(rows)
    live = os.path.join(root, name, "zarr.json")
    if txn is None:
        replace_json(live, upd)
        return
    with open(live, encoding="utf-8") as f:
        doc = json.load(f)
    upd(doc)
    dest = txn.file(f"{name}/zarr.json")
    write_json(dest, doc, fsync=False)
    txn.sync_later(dest)


def table_id(attrs: dict) -> str | None:
    """The table's id (``attributes.embstore.table_id``: 32 random hex digits written at
    save and kept by every commit, compaction and upgrade), None for a table written before
    ids (format 1, or format 2 of embstore <= 0.6) or with a malformed one."""
    v = attrs.get("table_id")
    return v if isinstance(v, str) and _TABLE_ID.fullmatch(v) else None


_TABLE_ID = re.compile(r"[0-9a-f]{32}")
