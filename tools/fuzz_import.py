"""Fuzz target for embstore's importers (atheris, coverage-guided; optional).

Every input is one file for one importer: the first byte picks the format (word2vec,
word2vec-binary, glove, fasttext, npy, safetensors, torch), the rest is the file.  The
target imports it with :func:`embstore.convert.import_file` into a fresh directory
and fails on anything but success or an :class:`embstore.EmbstoreError`, and on a
destination or temporary directory left behind after an error.  (The value checks against
independent readers live in ``tests/reliability/test_hostile_imports.py``.)

atheris is not a dependency of embstore.  To run the fuzzer::

    pip install atheris                       # a wheel for CPython 3.11 on Linux x86-64
    python tools/fuzz_import.py -atheris_runs=100000 fuzz-corpus/
    python tools/fuzz_import.py --format npy -max_len=4096 fuzz-corpus/   # one format

Arguments after the script's own (``--format``) go to libFuzzer (``-runs``, ``-max_len``,
``-timeout``, a corpus directory, a crashing input to replay).  Seed the corpus with the
golden files: ``cp tests/data/* fuzz-corpus/`` (their first byte then picks the format).

Without atheris, ``--random N`` runs N random mutations of the golden files instead (no
coverage guidance; handy as a smoke run)::

    python tools/fuzz_import.py --random 2000 [--format glove] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

FORMATS = ("word2vec", "word2vec-binary", "glove", "fasttext", "npy", "safetensors", "torch")
_ONLY: str | None = None


def one_input(data: bytes) -> None:
    """The fuzz target: import ``data`` (first byte: format) and check the outcome."""
    if not data:
        return
    from embstore.errors import EmbstoreError
    from embstore.convert import import_file

    fmt = _ONLY or FORMATS[data[0] % len(FORMATS)]
    body = data if _ONLY else data[1:]
    work = tempfile.mkdtemp(prefix="embstore-fuzz-")
    try:
        src = os.path.join(work, "src")
        with open(src, "wb") as f:
            f.write(body)
        dest = os.path.join(work, "dest")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a warning on hostile input is a finding too
                import_file(src, dest, format=fmt, block_rows=64)
        except EmbstoreError:
            left = sorted(set(os.listdir(work)) - {"src"})
            if left:
                raise AssertionError(f"{fmt}: left behind after an error: {left}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _seeds() -> list[bytes]:
    data = os.path.join(os.path.dirname(HERE), "tests", "data")
    out = []
    for name in sorted(os.listdir(data)) if os.path.isdir(data) else []:
        with open(os.path.join(data, name), "rb") as f:
            out.append(f.read()[:1 << 16])
    return out or [b"2 3\na 1 2 3\nb 4 5 6\n"]


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    how = rng.randrange(5)
    if how == 0 and raw:
        return raw[:rng.randrange(len(raw))]
    if how == 1 and raw:
        i = rng.randrange(len(raw))
        return raw[:i] + bytes([raw[i] ^ (1 << rng.randrange(8))]) + raw[i + 1:]
    if how == 2:
        i = rng.randrange(len(raw) + 1)
        return raw[:i] + rng.randbytes(rng.randrange(1, 16)) + raw[i:]
    if how == 3 and raw:
        i, j = sorted(rng.randrange(len(raw)) for _ in range(2))
        return raw[:i] + raw[j:]
    return rng.randbytes(rng.randrange(200))


def _random_run(n: int, seed: int) -> None:
    rng = random.Random(seed)
    seeds = _seeds()
    for k in range(n):
        fmt_byte = bytes([FORMATS.index(_ONLY) if _ONLY else rng.randrange(len(FORMATS))])
        data = _mutate(rng, rng.choice(seeds))
        try:
            one_input(data if _ONLY else fmt_byte + data)
        except Exception:
            path = f"crash-{seed}-{k}"
            with open(path, "wb") as f:
                f.write(data if _ONLY else fmt_byte + data)
            print(f"crash on input {k}; saved as {path}", file=sys.stderr)
            raise
    print(f"{n} random inputs, no crash")


def main(argv: list[str]) -> None:
    global _ONLY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], add_help=True)
    parser.add_argument("--format", choices=FORMATS, help="fuzz one importer only")
    parser.add_argument("--random", type=int, metavar="N",
                        help="N random mutations of the golden files (no atheris needed)")
    parser.add_argument("--seed", type=int, default=0)
    ours, rest = parser.parse_known_args(argv[1:])
    _ONLY = ours.format
    if ours.random is not None:
        _random_run(ours.random, ours.seed)
        return
    try:
        import atheris
    except ImportError:
        sys.exit("atheris is not installed: pip install atheris (or use --random N)")
    with atheris.instrument_imports(include=["embstore"]):  # coverage of embstore's code
        import embstore.convert  # noqa: F401
        for fmt in FORMATS:
            embstore.formats.get(fmt)
    atheris.Setup([argv[0], *rest], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
