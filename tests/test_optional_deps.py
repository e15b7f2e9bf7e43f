"""Missing optional dependencies: one line naming the extra, never a ModuleNotFoundError."""

from __future__ import annotations

import builtins
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import embstore
from embstore.batch import lookup_file
from embstore.cli import cli
from embstore.errors import EmbstoreError, MissingDependencyError


def block_imports(monkeypatch, *names):
    """Make ``import name`` (and its submodules) fail as if the package were not installed."""
    real = builtins.__import__

    def fake(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and any(name == n or name.startswith(n + ".") for n in names):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", fake)
    for mod in list(sys.modules):
        if any(mod == n or mod.startswith(n + ".") for n in names):
            monkeypatch.setitem(sys.modules, mod, None)


@pytest.fixture
def pt_file(tmp_path, rng):
    torch = pytest.importorskip("torch")
    path = tmp_path / "w.pt"
    torch.save({"weight": torch.from_numpy(rng.standard_normal((5, 3)).astype(np.float32))},
               path)
    return path


def test_torch_missing_cli_one_line(monkeypatch, tmp_path, pt_file):
    block_imports(monkeypatch, "torch")
    res = CliRunner().invoke(cli, ["import", str(pt_file), str(tmp_path / "t")])
    assert res.exit_code == 1, res.output
    assert res.output.strip().splitlines() == [
        "Error: reading PyTorch files needs torch, which is not installed: "
        "pip install 'embstore[torch]'"]
    assert isinstance(res.exception, SystemExit)  # a clean exit, not a traceback
    assert not (tmp_path / "t").exists()


def test_torch_missing_api_error(monkeypatch, tmp_path, pt_file):
    block_imports(monkeypatch, "torch")
    with pytest.raises(MissingDependencyError, match=r"pip install 'embstore\[torch\]'") as info:
        embstore.import_file(pt_file, tmp_path / "t")
    assert isinstance(info.value, EmbstoreError) and isinstance(info.value, ImportError)
    assert info.value.extra == "torch" and info.value.module == "torch"


def test_dask_missing_cli_one_line_and_no_output(monkeypatch, tmp_path, rng):
    embstore.save(tmp_path / "t", rng.standard_normal((10, 3)).astype(np.float32)).close()
    np.save(tmp_path / "ids.npy", np.arange(5))
    block_imports(monkeypatch, "dask", "distributed")
    res = CliRunner().invoke(cli, ["lookup", str(tmp_path / "t"), str(tmp_path / "ids.npy"),
                                   str(tmp_path / "o.zarr"), "--scheduler", "local"])
    assert res.exit_code == 1, res.output
    assert res.output.strip().splitlines() == [
        "Error: running a batch job on a Dask scheduler needs dask, which is not installed: "
        "pip install 'embstore[dask]'"]
    with pytest.raises(MissingDependencyError, match=r"embstore\[dask\]"):
        lookup_file(tmp_path / "t", tmp_path / "ids.npy", tmp_path / "o.npy", scheduler="local")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ids.npy", "t"]


def test_core_features_work_without_optional_packages(monkeypatch, tmp_path, rng):
    block_imports(monkeypatch, "torch", "dask", "distributed", "safetensors", "gensim",
                  "tensorstore")
    E = rng.standard_normal((20, 4)).astype(np.float32)
    embstore.save(tmp_path / "t", E, keys=[f"k{i}" for i in range(20)]).close()
    embstore.export_table(tmp_path / "t", tmp_path / "w.safetensors")
    res = CliRunner().invoke(cli, ["import", str(tmp_path / "w.safetensors"), str(tmp_path / "u"),
                                   "-q"])
    assert res.exit_code == 0, res.output
    np.save(tmp_path / "ids.npy", np.arange(6))
    lookup_file(tmp_path / "u", tmp_path / "ids.npy", tmp_path / "o.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), E[:6])


def test_declared_extras_are_used():
    """Every extra but test/benchmarks/all names a package that embstore imports."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    source = "\n".join(p.read_text() for p in (root / "embstore").rglob("*.py"))
    for extra in set(extras) - {"test", "benchmarks", "all"}:
        assert re.search(rf"extra=\"{extra}\"", source), f"extra {extra!r} is never required"
