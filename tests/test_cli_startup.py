"""The command line imports what a command runs: ``embstore --help`` loads no NumPy and no
subpackage, and every command the group lists lazily is the one its module declares."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import click
import pytest

import embstore
from embstore.cli import COMMANDS, cli

HEAVY = ("numpy", "embstore.batch", "embstore.store", "embstore.search", "embstore.formats",
         "embstore.convert", "embstore.layer", "embstore.keys", "zarr")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\n"
                          "print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_help_loads_no_numpy_and_no_subpackage():
    loaded = _modules_after("from embstore.cli import main\nimport sys\nsys.argv = ['embstore', "
                            "'--help']\ntry:\n    main()\nexcept SystemExit:\n    pass")
    assert sorted(m for m in loaded if m.split(".")[0] == "numpy" or any(
        m == h or m.startswith(h + ".") for h in HEAVY)) == []
    ours = sorted(m for m in loaded if m.startswith("embstore"))
    assert ours == ["embstore", "embstore._version", "embstore.cli", "embstore.cli.terms",
                    "embstore.errors", "embstore.optional"]


def test_info_loads_no_batch_job_format_or_search_pipeline():
    loaded = _modules_after("import embstore.cli.info")
    for heavy in ("embstore.batch", "embstore.convert", "embstore.layer",
                  "embstore.search.exact", "zarr", "torch"):
        assert heavy not in loaded, heavy


def test_info_command_loads_what_opening_a_table_needs(tmp_path):
    """``embstore info TABLE`` run to the end: the table's description, through
    ``store.table`` alone: not the writers (``store.build``), the search pipelines (FAISS's
    ``ann``/``ivf``, the exact scans), whole-table scans, batch jobs, conversions or zarr."""
    import numpy as np
    path = tmp_path / "t.emb"
    embstore.save(path, np.arange(40, dtype=np.float32).reshape(10, 4), keys=list("abcdefghij"))
    code = ("from embstore.cli import main\nimport sys\nsys.argv = ['embstore', 'info', "
            f"{str(path)!r}, '--json']\ntry:\n    main()\nexcept SystemExit as e:\n"
            "    assert e.code in (0, None), e.code")
    loaded = _modules_after(code)
    assert "embstore.store.table" in loaded and "embstore.search.indexmeta" in loaded
    banned = ("embstore.store.build", "embstore.store.scan", "embstore.search.ann",
              "embstore.search.ivf", "embstore.search.exact", "embstore.search.stream",
              "embstore.search.topk", "embstore.batch", "embstore.convert", "embstore.layer",
              "embstore.memory.", "embstore.formats.npy", "embstore.formats.safetensors",
              "embstore.formats.torch", "embstore.cli.files", "embstore.cli.tables",
              "zarr", "dask", "torch", "faiss")
    assert sorted(m for m in loaded if any(m == b or m.startswith(b.rstrip(".") + ".")
                                           for b in banned)) == []


def test_one_store_module_loads_no_other_part_of_the_store():
    """``store/__init__`` is lazy: the object-storage client or the metadata reader alone
    loads neither the table, nor the writers, nor verify; the public names still resolve."""
    for module in ("embstore.store.place.objstore", "embstore.store.meta"):
        loaded = _modules_after(f"import {module}")
        assert not {"embstore.store.table", "embstore.store.build",
                    "embstore.store.verify"} & loaded, module
    import embstore.store as store
    from embstore.store.build import create, save, upgrade
    from embstore.store.table import ZarrTable, open as open_table
    from embstore.store.verify import verify
    assert (store.create, store.save, store.upgrade, store.ZarrTable, store.open,
            store.verify) == (create, save, upgrade, ZarrTable, open_table, verify)
    assert set(store.__all__) <= set(dir(store))
    assert store.rows.layout is importlib.import_module("embstore.store.rows.layout")
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        store.nosuch  # noqa: B018


def test_import_and_export_load_no_batch_pipeline():
    loaded = _modules_after("import embstore.cli.files")
    assert not [m for m in loaded if m == "embstore.batch" or m.startswith("embstore.batch.")]
    assert "embstore.cli.lookup" not in loaded


def test_help_lists_every_command_with_its_own_short_help():
    res = subprocess.run([sys.executable, "-m", "embstore", "--help"], capture_output=True,
                         text=True, timeout=120, check=True)
    listed = [line.split()[0] for line in res.stdout.split("Commands:")[1].splitlines()
              if line.strip()]
    assert listed == sorted(COMMANDS)
    for name, (module, attr, short) in COMMANDS.items():
        command = getattr(importlib.import_module(f"embstore.cli.{module}"), attr)
        assert isinstance(command, click.Command) and command.name == name
        assert command.short_help == short, name
        assert short in res.stdout


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_resolves_through_the_group(name):
    ctx = click.Context(cli)
    assert cli.get_command(ctx, name).name == name
    assert cli.get_command(ctx, "nosuchcommand") is None


def test_the_package_keeps_every_public_name():
    fresh = _modules_after("import embstore")
    assert "numpy" not in fresh
    for name in embstore.__all__:
        assert getattr(embstore, name) is not None, name
    assert set(embstore.__all__) <= set(dir(embstore))
    assert embstore.open is embstore.store.open and embstore.Table is embstore.table.Table
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        embstore.nosuch  # noqa: B018
    probe = _modules_after("import embstore\nembstore.keys.hashing")  # subpackages on use
    assert "embstore.keys.hashing" in probe
