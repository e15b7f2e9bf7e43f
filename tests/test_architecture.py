"""The package's shape, checked from its source with ``ast`` (nothing is imported).

- no import cycles between embstore's modules;
- ``formats/`` is a leaf: it imports nothing from the store, the key index, batch jobs,
  the import/export pipeline or the command line;
- only the command line (``cli/``, ``demo.py``) imports click;
- no internal import inside a function (only heavy optional third-party packages are
  imported lazily);
- no module over 420 lines.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "embstore"
MAX_LINES = 420


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (``from . import x`` gives the package)."""
    if node.level == 0:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, ast.stmt, bool]]:
    """``(imported module, node, inside a function)`` for every import in ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[str, ast.stmt, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                       ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, child, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(module, path, child)
                subs = [f"{target}.{a.name}" for a in child.names
                        if f"{target}.{a.name}" in MODULES]  # from . import demo
                found.extend((sub, child, in_function) for sub in subs)
                if len(subs) < len(child.names):  # names defined in the module itself
                    found.append((target, child, in_function))
            visit(child, inside)

    visit(tree, False)
    return found


def _internal(target: str) -> str | None:
    """The embstore module ``target`` refers to (or the nearest package), else None."""
    while target:
        if target in MODULES:
            return target
        target = target.rpartition(".")[0]
    return None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for target, _, in_function in _imports(m):
            dep = _internal(target)
            if dep is not None and dep != m and not in_function:
                graph[m].add(dep)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_walker_sees_the_package():
    graph = _graph()
    assert "embstore.store.table" in MODULES and "embstore.formats" in MODULES
    assert "embstore.store.writer" in graph["embstore.store.table"]
    assert "embstore.formats" in graph["embstore.formats.npy"]  # from . import ...


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("embstore.formats")])
def test_formats_is_a_leaf(module):
    forbidden = ("embstore.store", "embstore.keys", "embstore.batch", "embstore.cli",
                 "embstore.convert", "embstore.demo", "embstore.layer", "click")
    bad = [(t, n.lineno) for t, n, _ in _imports(module)
           if any(t == f or t.startswith(f + ".") for f in forbidden)]
    assert bad == [], f"{module} imports {bad}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_command_line_imports_click(module):
    if module == "embstore.demo" or module.split(".")[:2] == ["embstore", "cli"]:
        return
    bad = [n.lineno for t, n, _ in _imports(module) if t == "click" or t.startswith("click.")]
    assert bad == [], f"{module} imports click at lines {bad}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_internal_import_inside_a_function(module):
    bad = [(t, n.lineno) for t, n, inside in _imports(module)
           if inside and _internal(t) is not None]
    assert bad == [], f"{module} imports {bad} inside a function"


# Known to be over the limit, to be split (strict: the mark fails once the module is short).
TOO_LONG: dict[str, str] = {}  # module -> why it may stay long for now (strict xfail)


@pytest.mark.parametrize("module", [
    pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=TOO_LONG[m])) if m in TOO_LONG
    else m for m in sorted(MODULES)])
def test_no_module_is_too_long(module):
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module]} has {lines} lines (at most {MAX_LINES})"


_FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z-]+")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "embstore.demo"
                                          and not m.startswith("embstore.cli")))
def test_library_errors_name_parameters_not_flags(module):
    """The text of every ``raise`` below the command line is free of ``--flag`` words."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for sub in ast.walk(node.exc):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str) \
                        and _FLAG_RE.search(sub.value):
                    bad.append((node.lineno, sub.value))
    assert bad == [], f"{module} raises errors naming command-line flags: {bad}"
