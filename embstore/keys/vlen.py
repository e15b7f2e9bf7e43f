"""Chunks of the ``keys`` string array written without zarr-python's machinery: each chunk
is what zarr writes for codecs ``[vlen-utf8, zstd(level 3, no checksum), crc32c]`` (the
codecs embstore creates ``keys`` with), byte for byte: numcodecs' vlen-utf8 encoding of the
chunk's keys (the last chunk padded with the fill value ``""``), zstd, then the crc32c of
that as 4 little-endian bytes.  ~6 ms per 65,536 keys, where zarr-python's write of the same
chunks took 30-150 ms.  Arrays with other codecs are written through zarr-python."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..fs.checksum import crc32c

__all__ = ["plain_keys_codecs", "write_keys_chunks"]

_PLAIN = [{"name": "vlen-utf8"}, {"name": "zstd", "level": 3, "checksum": False},
          {"name": "crc32c"}]


def plain_keys_codecs(meta: dict) -> bool:
    """Whether the ``keys`` array of metadata ``meta`` has exactly the codecs written here
    (and the default chunk key encoding, fill value ``""``)."""
    try:
        codecs = [{"name": c["name"], **c.get("configuration", {})} for c in meta["codecs"]]
        cke = meta["chunk_key_encoding"]
        return (codecs == _PLAIN and meta["data_type"] == "string"
                and meta.get("fill_value", "") == "" and cke["name"] == "default"
                and cke.get("configuration", {}).get("separator", "/") == "/"
                and not meta.get("storage_transformers"))
    except (KeyError, TypeError, AttributeError):
        return False


def write_keys_chunks(array_dir: Path, chunk: int, first_chunk: int, keys: list[str]) -> list[str]:
    """Write chunks ``first_chunk, ...`` of the ``keys`` array at ``array_dir`` holding
    ``keys`` (the last chunk padded with ``""``; not fsynced: the caller's transaction
    does); returns their file names (under ``array_dir/c``)."""
    from numcodecs import VLenUTF8
    from numcodecs.zstd import Zstd

    vlen, zstd = VLenUTF8(), Zstd(level=3, checksum=False)
    (array_dir / "c").mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(0, len(keys), chunk):  # a loop per chunk of 65,536 keys
        part = np.array(keys[i: i + chunk] + [""] * max(0, i + chunk - len(keys)), dtype=object)
        body = bytes(zstd.encode(vlen.encode(part)))
        name = str(first_chunk + i // chunk)
        with open(array_dir / "c" / name, "wb") as f:
            f.write(body)
            f.write(struct.pack("<I", crc32c(body)))
        names.append(name)
    return names
