"""``embstore demo [DIR]``: the whole product in one command.

Imports a real word2vec file (word vectors trained on the Lee news corpus that
gensim ships), looks rows up by id in every shape and by word, runs the
embedding layer's operations, shows the row cache at work on Zipf traffic,
runs a batch lookup job (streamed, then on a local Dask cluster when dask is
installed), exports the table again and verifies every checksum.  Each step
checks its result against plain NumPy and stops with an error if they differ.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import click
import numpy as np

import embstore

__all__ = ["run"]


def _say(title: str) -> None:
    click.secho(f"\n== {title}", bold=True)


_cli: Callable[[list[str]], object] | None = None  # runs one embstore command (set by run)


def _run_cli(*args: str) -> None:
    click.secho("$ embstore " + " ".join(shlex.quote(a) for a in args), fg="cyan")
    assert _cli is not None
    _cli(list(args))


_passed: list[str] = []  # the checks that passed in this run


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise click.ClickException(f"demo check failed: {what}")
    _passed.append(what)
    click.echo(f"   ok: {what}")


def run(directory: str | None, *, no_dask: bool,
        run_cli: Callable[[list[str]], object]) -> dict:
    """Run the main job end to end in ``directory`` (default: a temporary folder);
    ``run_cli(args)`` runs one ``embstore`` command (the CLI passes itself).  Returns a
    summary: ``ok``, ``checks`` (what was checked against NumPy), ``seconds``."""
    global _cli
    _cli = run_cli
    _passed.clear()
    t0 = time.perf_counter()
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="embstore-demo-") as tmp:
            _demo(Path(tmp), no_dask)
    else:
        Path(directory).mkdir(parents=True, exist_ok=True)
        _demo(Path(directory), no_dask)
    return {"ok": True, "directory": directory, "checks": list(_passed),
            "seconds": round(time.perf_counter() - t0, 3)}


def _demo(root: Path, no_dask: bool) -> None:
    """The six steps, each checked against an independent NumPy reference."""
    _say("1. Import a real word2vec text file (trained on gensim's Lee corpus)")
    store, text_lines = _import_lee(root)
    # an independent reference: parse the text file with plain Python
    words = [line.split(" ", 1)[0] for line in text_lines[1:]]
    ref = np.array([[float(v) for v in line.split()[1:]] for line in text_lines[1:]],
                   dtype=np.float32)

    _say("2. Look rows up by id, in every shape, and by word")
    t = embstore.open(store, cache_bytes="64KiB")
    click.echo(f"   {t!r}, opened from {store}")
    ids = _look_up(t, ref, words)
    _say("3. The embedding layer: mask, bags, logits, similarity")
    _layer(t, ref, ids)
    _say("4. The LRU row cache on Zipf-distributed traffic")
    zipf = _zipf_traffic(t)
    t.close()

    _say("5. A batch lookup job: ids.npy in, vectors out")
    _batch_job(root, store, ref, zipf, no_dask)
    _say("6. Export again and verify the store")
    _export_and_verify(root, store, text_lines, ref, words)
    click.secho("\nDemo finished: every step matched its NumPy reference.", fg="green")


def _import_lee(root: Path) -> tuple[Path, list[str]]:
    """Import the packaged word2vec file into ``root/lee.emb``; the store and the file's
    lines."""
    src = resources.files("embstore") / "data" / "lee_word2vec.txt"
    with resources.as_file(src) as src_path:
        text_lines = Path(src_path).read_text(encoding="utf-8").splitlines()
        store = root / "lee.emb"
        _run_cli("import", str(src_path), str(store), "--overwrite", "--quiet")
    _run_cli("info", str(store))
    return store, text_lines


def _look_up(t: embstore.Table, ref: np.ndarray, words: list[str]) -> np.ndarray:
    """Rows by id in every shape, a slice, a bad id refused, rows by word; the ids of
    three words."""
    for ids in (7, [3, 1, 4], [[0, 1], [2, 3]], np.arange(24).reshape(2, 3, 4)):
        got = t[ids]
        _check(np.array_equal(got, ref[np.asarray(ids)]),
               f"t[{np.asarray(ids).tolist() if np.ndim(ids) < 2 else f'<{np.ndim(ids)}-D ids>'}]"
               f" -> shape {got.shape} equals the text file's rows")
    _check(np.array_equal(t[10:15], ref[10:15]), "t[10:15] gives rows 10..14")
    try:
        t[[0, 5, len(t)]]
    except embstore.InvalidIdError as exc:
        click.echo(f"   a bad id is refused: InvalidIdError: {exc}")
    found = t.ids_of(["police", "australia", "fire"])
    _check([words[i] for i in found] == ["police", "australia", "fire"],
           f"ids_of(['police', 'australia', 'fire']) = {found.tolist()}")
    vec = t.lookup_keys([["police", "qwertyuiop"]], oov="zero")
    _check(np.array_equal(vec[0, 0], ref[found[0]]) and not vec[0, 1].any(),
           "lookup_keys with an unknown word gives a zero row (oov='zero')")
    return found


def _layer(t: embstore.Table, ref: np.ndarray, ids: np.ndarray) -> None:
    """The embedding layer's mask and scaling, bags, streamed logits and most_similar."""
    emb = embstore.Embedding(t, padding_idx=0, scale="sqrt_dim")
    batch = np.array([[5, 9, 0, 0], [12, 40, 41, 3]])
    mask = batch != 0
    out = emb(batch, mask=mask)
    want = np.where(mask[..., None], ref[batch], 0) * np.sqrt(t.dim)
    _check(np.allclose(out, want), f"emb(ids, mask) with padding and sqrt(d) scaling, shape {out.shape}")
    bags = embstore.Embedding(t).bag(np.array([1, 2, 3, 10, 11]), offsets=np.array([0, 3]),
                                     mode="mean")
    _check(np.allclose(bags, [ref[[1, 2, 3]].mean(0), ref[[10, 11]].mean(0)], atol=1e-6),
           "bag(mode='mean') over variable-length bags equals the rows' means")
    hidden = ref[[ids[0]]]
    values, top = embstore.Embedding(t).logits(hidden, top_k=3)
    full = hidden @ ref.T
    _check(np.array_equal(top[0], np.argsort(-full[0], kind="stable")[:3]),
           f"logits(h, top_k=3) streamed by row blocks: ids {top[0].tolist()}")
    sim_ids, scores = embstore.Embedding(t).most_similar("police", k=5)
    assert t.keys is not None
    click.echo("   most_similar('police'): " + ", ".join(
        f"{t.keys[i]} {s:.3f}" for i, s in zip(sim_ids.tolist(), scores.tolist())))


def _zipf_traffic(t: embstore.Table) -> np.ndarray:
    """Zipf-distributed lookups through the row cache, its hit rate checked; the ids."""
    rng = np.random.default_rng(0)
    zipf = (rng.zipf(1.2, size=(50, 512)) - 1) % len(t)
    for chunk in zipf:
        t.lookup(chunk)
    info = t.cache_info()
    rate = info.hits / max(1, info.hits + info.misses)
    click.echo(f"   {info}")
    _check(info.bytes <= info.capacity_bytes and rate > 0.5,
           f"hit rate {rate:.2f} with a {info.capacity_bytes // 1024} KiB budget "
           f"({info.entries} of {len(t)} rows cached)")
    return zipf


def _batch_job(root: Path, store: Path, ref: np.ndarray, zipf: np.ndarray,
               no_dask: bool) -> None:
    """``embstore lookup`` of the ids ``zipf`` to a .npy, then on a local Dask cluster to a
    Zarr array (when dask is installed and not ``no_dask``)."""
    ids_path = root / "ids.npy"
    np.save(ids_path, zipf)
    out_path = root / "vectors.npy"
    t0 = time.perf_counter()
    _run_cli("lookup", str(store), str(ids_path), str(out_path), "--overwrite", "--quiet")
    got = np.load(out_path)
    _check(np.array_equal(got, ref[zipf]),
           f"{out_path.name} {got.shape} equals ref[ids] ({time.perf_counter() - t0:.2f} s)")
    if no_dask:
        return
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        click.echo("   (dask is not installed: pip install 'embstore[dask]' for the cluster job)")
        return
    zarr_out = root / "vectors.zarr"
    t0 = time.perf_counter()
    _run_cli("lookup", str(store), str(ids_path), str(zarr_out), "--scheduler", "local",
             "--overwrite", "--quiet")
    import zarr

    got = np.asarray(zarr.open_array(zarr_out, mode="r")[...])
    _check(np.array_equal(got, ref[zipf]),
           f"the same job on a local Dask cluster, written to {zarr_out.name} "
           f"({time.perf_counter() - t0:.2f} s)")


def _export_and_verify(root: Path, store: Path, text_lines: list[str], ref: np.ndarray,
                       words: list[str]) -> None:
    """``embstore export`` to word2vec text, compared with the source file; ``verify``."""
    back = root / "lee-export.txt"
    _run_cli("export", str(store), str(back), "--format", "word2vec", "--overwrite", "--quiet")
    lines = back.read_text(encoding="utf-8").splitlines()
    vals = np.array([[float(v) for v in line.split()[1:]] for line in lines[1:]], np.float32)
    _check(lines[0].split() == text_lines[0].split() and np.array_equal(vals, ref)
           and [line.split(" ", 1)[0] for line in lines[1:]] == words,
           f"{back.name} has the same header, words and float32 values")
    _run_cli("verify", str(store))
