"""The package's shape, checked from its source with ``ast`` (nothing is imported).

- no import cycles between embstore's modules;
- ``formats/`` is a leaf: it imports nothing from the store, the key index, batch jobs,
  the import/export pipeline or the command line;
- only the command line (``cli/``, ``demo.py``) imports click;
- no internal import inside a function (only heavy optional third-party packages are
  imported lazily);
- no function or method over 80 lines (def line to last line, docstring included): a
  function does one thing you can name;
- no module over 420 lines but the cohesive ones of ``LONG_MODULES`` (one concept: a class
  and its helpers), each with its reason beside it; an entry whose module is back under
  the cap, or gone, fails too;
- folders that name what they hold: at most 18 modules directly in ``embstore/``, at most 12
  in any folder, and no family of modules sharing a prefix side by side (``shardread.py``
  beside ``shardwrite.py`` is a folder ``shard/`` waiting to be made);
- no ``getattr`` probe of a table's capabilities (they are members of ``Table``);
- every rename goes through ``fs/atomic.py`` (but its mechanics and the commit protocol);
- ``pooling`` takes plain values; prose names no module file by an old name.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "embstore"


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


@functools.lru_cache(maxsize=None)  # (four tests a module ask; each parse is read only)
def _imports(module: str) -> list[tuple[str, ast.stmt, bool]]:
    """``(imported module, node, inside a function)`` for every import in ``module``."""
    path = MODULES[module]
    tree = _tree(module)
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
    assert "embstore.store.versions.version" in graph["embstore.store.table"]
    assert "embstore.formats" in graph["embstore.formats.npy"]  # from . import ...


PLACE_BLIND = ("embstore.store.table", "embstore.store.versions.local",
               "embstore.store.versions.version", "embstore.store.source",
               "embstore.store.rows.source")


@pytest.mark.parametrize("module", PLACE_BLIND)
def test_the_table_never_asks_where_it_lives(module):
    """Where a table lives (a folder, object storage) is decided once, by
    ``store.history.versions_at``; the table, the local versions and the row sources see
    their place only through ``Versions`` and ``Place``: none of them imports object
    storage's client or versions, nor tests for a URL."""
    src = MODULES[module].read_text(encoding="utf-8")
    imported = _graph()[module]
    assert not {m for m in imported if m.startswith(("embstore.store.objects",
                                                     "embstore.store.remote",
                                                     "embstore.store.place.objstore"))}
    assert "is_url(" not in src and not re.search(r"\b_remote\b", src)


#: the modules that know media apart: the choice (history.py, place/where.py), each medium's
#: own files (place/, objects/, remote/) and verify's class a medium (verify/media.py)
MEDIA = ("embstore.store.history", "embstore.store.place", "embstore.store.objects",
         "embstore.store.remote", "embstore.store.verify.media")
_PLACE_TEST = re.compile(r"\bis_url\(|isinstance\([^)]*\b(LocalDir|ObjectStore)\b")


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("embstore.store")
                                    and not m.startswith(MEDIA)])
def test_no_test_of_the_medium_outside_the_seam(module):
    """Outside the place seam no module of store/ tests whether a table is local or on
    object storage (a URL test, an isinstance of a place): it asks its place or its
    versions (``build``'s save and refusals go through ``history``, ``verify``'s
    differences through ``verify.media``)."""
    src = MODULES[module].read_text(encoding="utf-8")
    assert not _PLACE_TEST.search(src), f"{module} tests its medium: {_PLACE_TEST.search(src)}"


def test_the_medium_test_finds_one():
    assert _PLACE_TEST.search("if is_url(path):") and _PLACE_TEST.search(
        "isinstance(place, ObjectStore)") and not _PLACE_TEST.search("isinstance(x, Place)")


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("embstore.formats")])
def test_formats_is_a_leaf(module):
    forbidden = ("embstore.store", "embstore.keys", "embstore.batch", "embstore.cli",
                 "embstore.convert", "embstore.cli.demo", "embstore.layer", "click")
    bad = [(t, n.lineno) for t, n, _ in _imports(module)
           if any(t == f or t.startswith(f + ".") for f in forbidden)]
    assert bad == [], f"{module} imports {bad}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_only_the_command_line_imports_click(module):
    if module == "embstore.cli.demo" or module.split(".")[:2] == ["embstore", "cli"]:
        return
    bad = [n.lineno for t, n, _ in _imports(module) if t == "click" or t.startswith("click.")]
    assert bad == [], f"{module} imports click at lines {bad}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_internal_import_inside_a_function(module):
    bad = [(t, n.lineno) for t, n, inside in _imports(module)
           if inside and _internal(t) is not None]
    assert bad == [], f"{module} imports {bad} inside a function"


MAX_FUNCTION_LINES = 80  # def line to last line, docstring included (decorators not)


def _long_functions(tree: ast.AST, limit: int) -> list[tuple[int, str, int]]:
    """``(line, name, lines)`` of every function and method (nested ones too) over ``limit``
    lines."""
    return [(n.lineno, n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno is not None and n.end_lineno - n.lineno + 1 > limit]


def test_the_function_measure_counts_def_to_last_line():
    body = "".join(f"    x{i} = {i}\n" for i in range(78))
    src = ('@deco\ndef f():\n    """Doc."""\n' + body
           + "class C:\n    def m(self):\n" + body.replace("    ", "        ")
           + "        return 1\n")
    assert _long_functions(ast.parse(src), 79) == [(2, "f", 80), (83, "m", 80)]
    assert _long_functions(ast.parse(src), 80) == []


def test_no_function_is_too_long():
    """A function does one thing you can name: none in embstore/ passes 80 lines."""
    bad = [f"{MODULES[m].relative_to(PKG.parent)}:{line} {name} ({lines} lines)"
           for m in sorted(MODULES) for line, name, lines in _long_functions(
               _tree(m), MAX_FUNCTION_LINES)]
    assert bad == [], (f"functions over {MAX_FUNCTION_LINES} lines (split each into functions "
                       f"that each do one thing you can name): {bad}")


MAX_LINES = 420
# Modules that may pass MAX_LINES: each is one concept (a class and its helpers, one
# pipeline), and the reason is written beside it.  Cutting such a module into sibling
# modules, or a class into free functions over its privates, only to fit the count is the
# cut to avoid; a module that holds two concepts is split instead.
LONG_MODULES: dict[str, str] = {
    "embstore.store.writer": "TableWriter: one class, a table streamed front to back (rows, "
                             "stored codes, lazily generated rows) with the layout it chose",
    "embstore.table": "Table, the ABC both backends share (the contract's member table), with "
                      "Vocab and KeySequence, the key side every member by key is built on",
    "embstore.convert": "the file-to-table pipeline both ways: import_file and export_table "
                        "with their steps, sharing the keys file beside and the atomic write",
    "embstore.search.ivf": "the FAISS IVF index: its streamed two-pass build and IvfIndex, "
                           "the opened index, over one file format (docs/FORMAT.md §5)",
    "embstore.store.place.objstore": "ObjectClient: one class, every request a table's "
                                      "client makes (reads, uploads, conditional writes, "
                                      "listings) through one error translation and counter",
    "embstore.torch": "the torch.nn.Embedding and EmbeddingBag faces of a table: one base "
                      "module (torch's attributes, devices, forking), torch's error classes",
    "embstore.store.versions.commit": "the commit protocol: one Transaction (staged files, the "
                                      "journal, the snapshot) and its recovery, repair and "
                                      "settle, which read the same journal",
}


def _lines(module: str) -> int:
    return len(MODULES[module].read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_too_long(module):
    if module in LONG_MODULES:
        return  # (its reason is beside it; test_long_modules_are_long checks the entry)
    lines = _lines(module)
    path = MODULES[module]
    assert lines <= MAX_LINES, (
        f"{path} has {lines} lines (at most {MAX_LINES}): if it holds two concepts, give "
        f"each its module; if it is one (a class and its helpers), list it in LONG_MODULES "
        f"with the reason written beside it")


@pytest.mark.parametrize("module", sorted(LONG_MODULES))
def test_long_modules_are_long(module):
    """Every entry of ``LONG_MODULES`` names a module of today's tree that is over the cap,
    with a reason: an entry whose module is gone, or back under the cap, goes."""
    assert module in MODULES, f"LONG_MODULES lists {module}, which is gone: remove the entry"
    lines = _lines(module)
    assert lines > MAX_LINES, (f"{module} has {lines} lines, within the cap of {MAX_LINES}: "
                               f"remove its entry from LONG_MODULES")
    assert LONG_MODULES[module].strip(), f"LONG_MODULES gives {module} no reason"


MAX_TOP = 18    # files directly in embstore/ (its __init__.py and __main__.py counted)
MAX_FOLDER = 13  # modules in any folder below it (its __init__.py not counted)
FOLDERS = sorted({p.parent for p in MODULES.values()})


def _names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.py") if p.name != "__init__.py")


def _family(a: str, b: str) -> bool:
    """Two module names of one family: one starts the other (``search``, ``search_exact``),
    or they share their first word or their first four letters (``shardread``,
    ``shardwrite``; ``normcalc``, ``normsource``)."""
    a, b = a.lstrip("_"), b.lstrip("_")
    return (a.startswith(b) or b.startswith(a) or a.split("_")[0] == b.split("_")[0]
            or a[:4] == b[:4])


def test_the_family_rule_sees_families():
    assert _family("search", "search_exact") and _family("shardread", "shardwrite")
    assert _family("remote_keys", "remote_open") and _family("normcalc", "normsource")
    assert not _family("scan", "source") and not _family("tokens", "torch")


def test_few_modules_at_the_top():
    names = sorted(p.name for p in PKG.glob("*.py"))  # __init__.py and __main__.py too
    assert len(names) <= MAX_TOP, f"{len(names)} modules in embstore/: {names}"


@pytest.mark.parametrize("folder", [f for f in FOLDERS if f != PKG],
                         ids=lambda f: str(f.relative_to(PKG.parent)))
def test_no_folder_is_crowded(folder):
    names = _names(folder)
    assert len(names) <= MAX_FOLDER, (
        f"{folder.relative_to(PKG.parent)}/ holds {len(names)} modules (at most {MAX_FOLDER}): "
        f"group some into a folder that names what they share")


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: str(f.relative_to(PKG.parent)))
def test_no_family_of_modules_side_by_side(folder):
    names = _names(folder)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if _family(a, b)]
    assert pairs == [], (f"{folder.relative_to(PKG.parent)}/ has module families {pairs}: "
                         f"make each a folder")


_FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z-]+")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "embstore.cli.demo"
                                          and not m.startswith("embstore.cli")))
def test_library_errors_name_parameters_not_flags(module):
    """The text of every ``raise`` below the command line is free of ``--flag`` words."""
    tree = _tree(module)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for sub in ast.walk(node.exc):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str) \
                        and _FLAG_RE.search(sub.value):
                    bad.append((node.lineno, sub.value))
    assert bad == [], f"{module} raises errors naming command-line flags: {bad}"


_MOD_REF = re.compile(r":(mod|class|func|meth|data|exc|attr):`~?(embstore(?:\.\w+)+)`")


def _public_names() -> set[str]:
    tree = ast.parse(MODULES["embstore"].read_text(encoding="utf-8"))
    return {elt.value for node in tree.body if isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == "__all__" for t in node.targets)
            for elt in node.value.elts if isinstance(elt, ast.Constant)}  # type: ignore[attr-defined]


PUBLIC = _public_names()


def _names_a_module(role: str, ref: str) -> bool:
    """``:mod:`` names a module; the other roles a module (or a public name of the package)
    and then at most two names."""
    if role == "mod":
        return ref in MODULES
    parts = ref.split(".")
    if len(parts) <= 3 and parts[1] in PUBLIC:
        return True
    return any(".".join(parts[:k]) in MODULES for k in range(max(2, len(parts) - 2), len(parts)))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_docstrings_name_modules_that_exist(module):
    """Every ``:mod:`embstore.x``` (and ``:class:`~embstore.x.Y```) names a module of today's
    tree: a move that leaves a docstring pointing at the old place fails here."""
    text = MODULES[module].read_text(encoding="utf-8")
    bad = [ref for role, ref in _MOD_REF.findall(text) if not _names_a_module(role, ref)]
    assert bad == [], f"{module} names modules that do not exist: {bad}"


@functools.lru_cache(maxsize=None)  # parsed once a run: the tests only read the trees
def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(encoding="utf-8"), filename=str(MODULES[module]))


def _class_members(module: str, name: str) -> set[str]:
    """The names a class body defines (methods, properties, class attributes)."""
    cls = next(n for n in _tree(module).body if isinstance(n, ast.ClassDef) and n.name == name)
    out = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return out


TABLE_MEMBERS = _class_members("embstore.table", "Table")
_TABLEISH = re.compile(r"^_?(t|tab|table|src)$")  # the names tables go by


def _last_name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else (
        node.attr if isinstance(node, ast.Attribute) else "")


def test_table_declares_its_capabilities():
    """What callers used to probe for with ``getattr`` is a member of the ABC."""
    assert {"path", "layout", "subwords", "storage_dtype", "is_remote"} <= TABLE_MEMBERS


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_getattr_probe_on_tables(module):
    """No ``getattr(x, "<a Table member>", ...)`` and no ``getattr(table, "<name>", ...)``:
    a table's capabilities are declared members of :class:`embstore.table.Table` (with a
    default that MemoryTable and ZarrTable override), so callers read them directly.
    Probes of the platform (``getattr(os, "O_DIRECTORY", 0)``) and of other objects stay."""
    bad = []
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "getattr" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            name = node.args[1].value
            if name in TABLE_MEMBERS or _TABLEISH.match(_last_name(node.args[0])):
                bad.append((node.lineno, ast.unparse(node)))
    assert bad == [], f"{module} probes tables with getattr: {bad}"


# Where a bare rename may stay: the helper itself, and the commit protocol.
RENAME_ALLOWED = {
    "embstore.fs.atomic": "the one helper: write beside, then rename into place",
    "embstore.fs.beside": "the helper's mechanics (the exchange, the fallback's two renames, "
                          "putting back a table a killed swap set aside)",
    "embstore.torch": "the torch.nn.Embedding and EmbeddingBag faces of a table: one base "
                      "module (torch's attributes, devices, forking), torch's error classes",
    "embstore.store.versions.commit": "the commit protocol: the journal's rename is the commit point and "
                             "the roll-forward renames staged files over live ones, exactly "
                             "one rename(2) each, no stat before it (see the module doc)",
}


def _renames(tree: ast.AST) -> list[tuple[int, str]]:
    """``os.replace``/``os.rename``/``os.renames``/``shutil.move`` calls, imports of them, and
    ``Path.replace(p)``/``Path.rename(p)`` (one positional argument: ``str.replace`` takes
    two, ``dataclasses.replace`` keywords)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil") and any(
                a.name in ("replace", "rename", "renames", "move") for a in node.names):
            out.append((node.lineno, f"from {node.module} import ..."))
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner, attr = _last_name(node.func.value), node.func.attr
        if (owner == "os" and attr in ("replace", "rename", "renames")) or (
                owner == "shutil" and attr == "move") or (
                attr in ("replace", "rename") and owner != "dataclasses"
                and len(node.args) == 1 and not node.keywords):
            out.append((node.lineno, ast.unparse(node)))
    return out


def test_the_rename_finder_finds_renames():
    tree = ast.parse("os.replace(a, b)\nos.rename(a, b)\nPath(a).replace(b)\nshutil.move(a, b)\n"
                     "s.replace('a', 'b')\ndataclasses.replace(j, tmp=1)\np.rename(q)\n")
    assert [line for line, _ in _renames(tree)] == [1, 2, 3, 4, 7]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_renames_go_through_atomic(module):
    """Every write-and-rename goes through :mod:`embstore.fs.atomic` (``replace``/
    ``write_beside``), but in the modules of ``RENAME_ALLOWED``, each for its reason."""
    if module in RENAME_ALLOWED:
        return
    bad = _renames(_tree(module))
    assert bad == [], f"{module} renames files outside embstore.fs.atomic: {bad}"


def test_pooling_takes_plain_values():
    """``pooling`` reaches into no other object's private members (the layer passes arrays
    and a row reader)."""
    bad = [(n.lineno, ast.unparse(n)) for n in ast.walk(_tree("embstore.pooling"))
           if isinstance(n, ast.Attribute) and n.attr.startswith("_")
           and not n.attr.startswith("__")]
    assert bad == [], f"embstore.pooling uses private members: {bad}"


# Module files the layout steps renamed or removed (/work/notes/renames.md): prose that
# still names one points a reader at a file that is not there.
OLD_FILES = ("ann_ivf", "search_exact", "subword_search", "subword_import", "rowcaches",
             "normcalc", "normsource", "shardfile", "shardread", "shardcodec", "shardwrite",
             "remote_keys", "remote_open", "remote_verify", "fasttext_bin", "word2vec_binary",
             "zarrtable", "forksafe.py", "beside.py", "atomic.py", "topk.py", "quant.py",
             "arena.py", "objstore.py", "chunkcache.py", "transfer.py", "ranged.py",
             "ngrams.py")
_OLD_RE = re.compile(r"(?<![\w/])(?:embstore/|store/|keys/|formats/)?(" + "|".join(
    re.escape(n) for n in OLD_FILES) + r")\b")


OLD_MODULES = ("embstore.ann", "embstore.topk", "embstore.subword", "embstore.atomic",
               "embstore.beside", "embstore.files", "embstore.forksafe", "embstore.demo",
               "embstore.vocab", "embstore.store.ngrams", "embstore.store.quant",
               "embstore.store.arena", "embstore.store.objstore", "embstore.store.transfer",
               "embstore.store.chunkcache", "embstore.keys.ranged")
_OLD_DOTTED = re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in OLD_MODULES)
                         + r")(?![\w.])")


def test_the_old_name_finder_finds_old_names():
    text = ("see shardread and store/remote_open.py, fs/atomic.py, ZarrTable, embstore/atomic.py"
            " embstore.atomic, embstore.fs.atomic, embstore.subword_search, embstore.search.ann")
    assert [m.group(1) for m in _OLD_RE.finditer(text)] == [
        "shardread", "remote_open", "atomic.py", "subword_search"]
    assert [m.group(1) for m in _OLD_DOTTED.finditer(text)] == ["embstore.atomic"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_prose_names_no_old_module_file(module):
    """Docstrings and comments name modules by their place in today's tree."""
    text = MODULES[module].read_text(encoding="utf-8")
    bad = [(text.count("\n", 0, m.start()) + 1, m.group(0))
           for regex in (_OLD_RE, _OLD_DOTTED) for m in regex.finditer(text)]
    assert bad == [], f"{module} names module files by old names: {bad}"
