"""The command line imports what a command runs: ``embstore --help`` loads no NumPy and no
subpackage, and every command the group lists lazily is the one its module declares."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import click
import pytest

import embstore
from embstore.cli import COMMANDS, cli

HEAVY = ("numpy", "embstore.batch", "embstore.store", "embstore.search", "embstore.formats",
         "embstore.convert", "embstore.layer", "embstore.keys", "zarr")


def _modules_after(code: str, command: bool = True, env: dict | None = None) -> set[str]:
    """The modules loaded after ``code`` in a fresh interpreter: started as the ``embstore``
    console script starts (its ``sys.argv[0]`` is the script's path) unless ``command`` is
    false (a program)."""
    start = "import sys\nsys.argv = ['/usr/local/bin/embstore']\n" if command else ""
    out = subprocess.run([sys.executable, "-c", start + code + "\nimport sys, json\n"
                          "print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "EMBSTORE_IMPORT": "", **(env or {})}).stdout
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
        loaded = _modules_after(f"import {module}", env={"EMBSTORE_IMPORT": "lazy"})
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


# object storage's versions and opening, the verify walk, the import formats and uploads:
# none of them is needed to open a local table or describe it
NOT_FOR_LOCAL = ("embstore.store.objects", "embstore.store.remote", "embstore.store.place.objects",
                 "embstore.store.verify.run", "embstore.store.build", "embstore.formats",
                 "embstore.convert", "embstore.batch", "embstore.search.ann", "zarr")


def _ours(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if m.split(".")[0] == "embstore")


def _banned(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == b or m.startswith(b + ".")
                                           for b in NOT_FOR_LOCAL))


def test_the_import_graph_of_help_stays_small():
    """``embstore --help``: what a bare click program loads, six embstore modules and what
    click's help display imports (``shutil``, ``textwrap``, ``locale``): 17 modules beyond
    ``import click`` when written (22 with ``logging``, now imported when a command runs).
    Counted, not timed."""
    loaded = _modules_after("from embstore.cli import main\nimport sys\nsys.argv = ['embstore', "
                            "'--help']\ntry:\n    main()\nexcept SystemExit:\n    pass")
    bare = _modules_after("import click")
    assert len(_ours(loaded)) <= 6 and len(loaded - bare) <= 18, sorted(loaded - bare)
    assert "logging" not in loaded


def test_the_import_graph_of_opening_a_local_table_stays_small(tmp_path):
    """Opening a local table and reading rows and keys (every DataLoader worker, every batch
    task), and ``embstore info`` run to the end, load no object storage (its versions are
    imported at the seam, ``store.history.versions_at``, for a URL only), no verify walk and
    no import format; the count of embstore modules is held (84 and 94 when written; 105
    and 121 before)."""
    import numpy as np
    path = tmp_path / "t.emb"
    embstore.save(path, np.arange(40, dtype=np.float32).reshape(10, 4), keys=list("abcdefghij"))
    opened = _modules_after(f"import numpy as np, embstore\nt = embstore.open({str(path)!r})\n"
                            "assert t[np.arange(3)].shape == (3, 4)\n"
                            "assert t.lookup_keys(['b']).tolist() == [[4.0, 5.0, 6.0, 7.0]]")
    assert _banned(opened) == []
    assert len(_ours(opened)) <= 88, len(_ours(opened))
    code = ("from embstore.cli import main\nimport sys\nsys.argv = ['embstore', 'info', "
            f"{str(path)!r}]\ntry:\n    main()\nexcept SystemExit as e:\n"
            "    assert e.code in (0, None), e.code")
    described = _modules_after(code)
    assert _banned(described) == []
    assert len(_ours(described)) <= 98, len(_ours(described))


def test_a_url_still_opens_through_object_storage_versions():
    """The seam imports object storage's versions on the first URL (not before)."""
    from embstore.store import history
    loaded = _modules_after("import embstore.store.history")
    assert history.OBJECT_VERSIONS not in loaded
    versions_cls = importlib.import_module(history.OBJECT_VERSIONS).ObjectVersions
    assert versions_cls.__module__ == history.OBJECT_VERSIONS


def test_a_program_gets_the_read_path_with_import_embstore(tmp_path):
    """``import embstore`` in a program loads the local read path, so that ``open`` and
    the first lookup load nothing more of embstore (they take milliseconds, not imports);
    the console script and ``EMBSTORE_IMPORT=lazy`` load none of it."""
    import numpy as np
    path = tmp_path / "t.emb"
    E = np.arange(40, dtype=np.float32).reshape(10, 4)
    embstore.save(path, E).close()
    code = ("import sys, json, numpy as np\nimport embstore\nbefore = set(sys.modules)\n"
            f"t = embstore.open({str(path)!r})\nrows = t[np.array([3, 7])]\n"
            "print(json.dumps([sorted(m for m in set(sys.modules) - before "
            "if m.startswith('embstore')), rows.tolist()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True,
                         env={**os.environ, "EMBSTORE_IMPORT": ""}).stdout
    new, rows = json.loads(out.splitlines()[-1])
    assert rows == E[[3, 7]].tolist()
    assert new == []
    assert "embstore.store.table" in _modules_after("import embstore", command=False)
    lazy_m = subprocess.run([sys.executable, "-m", "embstore", "--help"], capture_output=True,
                            text=True, timeout=120, check=True,
                            env={**os.environ, "EMBSTORE_IMPORT": "",
                                 "PYTHONPROFILEIMPORTTIME": "1"}).stderr
    names = {line.rsplit("|", 1)[-1].strip() for line in lazy_m.splitlines() if "|" in line}
    assert "embstore.cli" in names  # (the import-time report names what was imported)
    assert not {"numpy", "embstore.table", "embstore.ids"} & names
    for lazy in (_modules_after("import embstore"),
                 _modules_after("import embstore", command=False,
                                env={"EMBSTORE_IMPORT": "lazy"})):
        assert "embstore.store.table" not in lazy and "numpy" not in lazy
    assert "embstore.store.table" in _modules_after("import embstore",
                                                    env={"EMBSTORE_IMPORT": "eager"})
