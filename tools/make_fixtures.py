"""Write the small golden files of tests/data/ (formats/import tests).

Run from the repository root: ``python tools/make_fixtures.py``.  The text files
are written byte by byte the way each real tool writes them (see the comments);
the gensim, safetensors and torch files come from those libraries themselves.
The expected values are in ``tests/data/expected.npy`` (float32, 5 x 4) with
keys ``KEYS``; every fixture holds exactly these rows.

``python tools/make_fixtures.py --golden`` writes only the golden format-v1 stores
``tests/data/golden-v1-none`` and ``golden-v1-zstd`` (``golden_data()``: 100 x 8 float32
with keys, chunk_rows 16, shard_rows 64, written by ``embstore.save``), and one store per
storage dtype (``golden-v1-float16``, ``-float64``, ``-bfloat16``, ``-int8``: the record's
``golden`` in :mod:`embstore.dtypes`), and the format-2 stores ``golden-v2-<dtype>`` (every
storage dtype, default format-2 layout; ``golden-v2-early-<dtype>`` are the first format-2
stores, whose ``norms`` and ``row_scale`` were format-1 arrays: kept, read back only), and
``golden-v2-sharded-<...>`` (format 2 in the sharded layouts: ``GOLDEN_V2_SHARDED``).  They freeze the
on-disk format: tests/test_golden.py reads them back exactly and checks that ``save``
still writes the same bytes.  Regenerate them only for a deliberate format change.
"""

from __future__ import annotations

import os
import sys

import numpy as np

DATA = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
KEYS = ["the", "of", "été", "naïve", "</s>"]
VALUES = np.array([[0.1, -0.25, 3.0, 1e-3],
                   [-1.5, 0.0, 2.125, -0.0625],
                   [7.75, 0.5, -0.3, 0.2],
                   [1e-8, 123.5, -4.0, 0.015625],
                   [0.0, 0.0, 0.0, 1.0]], dtype=np.float32)


GOLDEN_LAYOUT = {"chunk_rows": 16, "shard_rows": 64}  # two shards, a partial last chunk
#: format 2's sharded layouts (golden-v2-<name>): chunks with a codec and a crc32c each
GOLDEN_V2_SHARDED = {"sharded-zstd": {"compression": "zstd", **GOLDEN_LAYOUT},
                     "sharded-none": dict(GOLDEN_LAYOUT),
                     "sharded-int8-blosc": {"compression": "blosc", "dtype": "int8",
                                            **GOLDEN_LAYOUT}}


def golden_data() -> tuple[np.ndarray, list[str]]:
    """100 x 8 float32 values exact in binary (multiples of 1/8) and 100 keys, two non-ASCII."""
    i = np.arange(800, dtype=np.int64)
    values = (((i * 37) % 101 - 50) / 8).astype(np.float32).reshape(100, 8)
    keys = [f"w{r}" for r in range(100)]
    keys[3], keys[7] = "été", "naïve"
    return values, keys


GOLDEN_HASH_KEY = (0x0706050403020100, 0x0F0E0D0C0B0A0908)  # SipHash's test-vector key


def golden_stores() -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import shutil

    import embstore
    import embstore.keys.writer

    # the key hash is keyed per table at random; the golden stores use a fixed key so that
    # tests/test_golden.py can write the same bytes again (it reads the key back from them)
    embstore.keys.writer.new_hash_key = lambda: GOLDEN_HASH_KEY
    values, keys = golden_data()
    for compression in ("none", "zstd"):
        path = os.path.join(DATA, f"golden-v1-{compression}")
        shutil.rmtree(path, ignore_errors=True)
        embstore.save(path, values, keys=keys, compression=compression, format_version=1,
                      **GOLDEN_LAYOUT).close()
    from embstore.dtypes import DTYPES
    for record in DTYPES.values():  # one golden store per storage dtype (float32: "none")
        if record.golden != "golden-v1-none":
            path = os.path.join(DATA, record.golden)
            shutil.rmtree(path, ignore_errors=True)
            embstore.save(path, values, keys=keys, dtype=record.name, format_version=1,
                          **GOLDEN_LAYOUT).close()
    for record in DTYPES.values():  # format 2: every storage dtype (uncompressed only)
        path = os.path.join(DATA, f"golden-v2-{record.name}")
        shutil.rmtree(path, ignore_errors=True)
        embstore.save(path, values, keys=keys, dtype=record.name, format_version=2).close()
        # the table's files only: its private area (version 1's hard links) is not frozen
        shutil.rmtree(os.path.join(path, "vectors", ".embstore"))
    for name, layout in GOLDEN_V2_SHARDED.items():  # format 2, the sharded layouts
        path = os.path.join(DATA, f"golden-v2-{name}")
        shutil.rmtree(path, ignore_errors=True)
        embstore.save(path, values, keys=keys, **layout).close()
        shutil.rmtree(os.path.join(path, "vectors", ".embstore"))


def _fmt_c(x: float) -> str:
    return "%lf" % x  # the C tool and GloVe: printf("%lf")


def main() -> None:
    os.makedirs(DATA, exist_ok=True)
    p = lambda name: os.path.join(DATA, name)  # noqa: E731
    np.save(p("expected.npy"), VALUES)
    with open(p("vocab.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(KEYS) + "\n")

    # gensim save_word2vec_format(binary=False): "key v1 v2\n", str(float32), no trailing space
    from gensim.models import KeyedVectors
    kv = KeyedVectors(4)
    kv.add_vectors(KEYS, VALUES)
    kv.save_word2vec_format(p("gensim.txt"), binary=False)
    # gensim binary: "key " + float32 bytes, no newline after the vector
    kv.save_word2vec_format(p("gensim.bin"), binary=True)

    # C word2vec text output on Windows: "%lf " with a trailing space, \r\n, no final newline
    rows = [f"{k} " + "".join(_fmt_c(v) + " " for v in r) for k, r in zip(KEYS, VALUES.tolist())]
    with open(p("c_crlf.txt"), "wb") as f:
        f.write(f"{len(KEYS)} 4\r\n".encode() + "\r\n".join(rows).encode("utf-8"))

    # fastText .vec: header, "key v1 v2 ... " (trailing space) and "\n"
    with open(p("fasttext.vec"), "wb") as f:
        f.write(f"{len(KEYS)} 4\n".encode())
        for k, r in zip(KEYS, VALUES.tolist()):
            f.write((k + " " + " ".join("%.5g" % v for v in r) + " \n").encode())

    # GloVe: no header, "key %lf %lf\n"; 840B has keys holding spaces such as ". . ."
    gkeys = KEYS[:4] + [". . ."]
    with open(p("glove.txt"), "wb") as f:
        for k, r in zip(gkeys, VALUES.tolist()):
            f.write((k + "".join(" " + _fmt_c(v) for v in r) + "\n").encode())

    # C word2vec binary: "key " + float32 bytes + "\n"; one key holds a space
    bkeys = KEYS[:4] + ["new york"]
    with open(p("c_space.bin"), "wb") as f:
        f.write(f"{len(bkeys)} 4\n".encode())
        for k, r in zip(bkeys, VALUES):
            f.write(k.encode() + b" " + r.astype("<f4").tobytes() + b"\n")

    np.save(p("float16.npy"), VALUES.astype(np.float16))
    np.save(p("float64.npy"), VALUES.astype(np.float64))

    from safetensors.numpy import save_file
    save_file({"embeddings.word_embeddings.weight": VALUES,
               "embeddings.LayerNorm.bias": np.zeros(4, np.float32)}, p("one2d.safetensors"),
              metadata={"format": "pt"})
    save_file({"encoder.weight": VALUES, "decoder.weight": VALUES[::-1].copy(),
               "ids": np.arange(5, dtype=np.int64)}, p("two2d.safetensors"))

    import torch
    torch.save({"embedding.weight": torch.from_numpy(VALUES).to(torch.bfloat16),
                "step": torch.tensor(3)}, p("bf16.pt"))
    torch.save({"model": {"emb.weight": torch.from_numpy(VALUES),
                          "proj.weight": torch.ones(2, 4)}}, p("nested.pt"))


if __name__ == "__main__":
    if sys.argv[1:] == ["--golden"]:
        golden_stores()
    else:
        main()
        golden_stores()
