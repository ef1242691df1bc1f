"""The layout shows the architecture: no import circles, pure stages that declare
themselves and hold no SQL, indexes in the store, reasons for late imports."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "workers", "schema")
# The seed's boxes, each a task named search.<stage> declared by the module
# pipeline.stages.<stage> (a file, or a package holding the stage's helpers);
# the recency boost is a helper of search.fuse (pipeline.stages.fuse.recency):
# it re-ranks the fused list, and a hop of its own would cost a message.
TASK_STAGES = ("embed", "descend", "fulltext", "fuse", "augment", "scope", "budget")
# What pipeline/stages holds besides the stages: how a stage is declared, and the list of them.
NOT_STAGES = ("pipeline.stages", "pipeline.stages.stage", "pipeline.stages.registry")
# What a stage may import from the store: the indexes' faces, the published
# state it reads (``View``, the deltas' ``Overlay`` it carries) and the graph
# read augment needs; never the database, writes, segments or an index's insides.
STAGE_STORE_IMPORTS = ("pipeline.store.fulltext", "pipeline.store.vector", "pipeline.store.reader",
                       "pipeline.store.overlay", "pipeline.store.graph")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``name`` imports, at module level or inside functions.

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to
    ``a.b``; the parent packages Python initialises on the way are not edges
    (a package's ``__init__`` re-exporting its submodules is not a circle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        edges |= {t for t in targets if t in known and t != name}
    return edges


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_the_packages():
    graph = _graph()
    assert len(graph) > 40 and graph["workers.cli"], "the walk found the modules and their imports"
    assert _cycles(graph) == []


def test_pipeline_never_imports_celery_or_the_workers():
    modules = _modules()
    for name, path in modules.items():
        if not name.startswith("pipeline"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            assert not set(roots) & {"celery", "kombu", "redis", "workers"}, f"{name} imports {roots}"


def _code_lines(path: Path) -> int:
    """Lines of code: not blank, not comments, not docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = path.read_text(encoding="utf-8").splitlines()
    return sum(1 for i, line in enumerate(lines, start=1)
               if line.strip() and not line.strip().startswith("#") and i not in docs)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_above_500_lines_of_code(package):
    sizes = {name: _code_lines(path) for name, path in _modules().items() if name.startswith(package)}
    assert sizes
    assert {name: n for name, n in sizes.items() if n > 500} == {}


def test_each_seed_stage_is_a_task_declared_in_a_module_named_after_it():
    from pipeline.stages.registry import STAGES
    from workers.app import get_app

    names = {name for name in get_app().tasks if name.startswith("search.")}
    assert names == {f"search.{stage}" for stage in TASK_STAGES} == set(STAGES)
    for stage in TASK_STAGES:
        module = importlib.import_module(f"pipeline.stages.{stage}")
        assert module.STAGE is STAGES[f"search.{stage}"], stage
    assert (ROOT / "pipeline" / "stages" / "fuse" / "recency.py").is_file()


def test_the_registry_only_lists_the_stages():
    """Behaviour lives in the stage modules: the registry defines no stage function."""
    tree = ast.parse((ROOT / "pipeline" / "stages" / "registry.py").read_text(encoding="utf-8"))
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)] == ["run_local"]


def test_every_module_directly_in_stages_is_a_stage():
    """Helpers that are not stages live inside the stage that uses them (a
    subpackage such as ``stages/fuse``), not beside the stages."""
    modules = _modules()
    top = [name for name in modules if name.startswith("pipeline.stages")
           and name.count(".") == 2 and name not in NOT_STAGES]
    assert sorted(top) == sorted(f"pipeline.stages.{s}" for s in TASK_STAGES)


_SQL = re.compile(r"\bSELECT\b|\bFROM\b[\s\S]*\bWHERE\b|\bINSERT\s+INTO\b|\bPRAGMA\b|\bCREATE\s+(OR\s+REPLACE\s+)?TABLE\b")


def _sql_in(path: Path) -> list[str]:
    """SQL-looking string constants and ``.execute(`` calls of a module (docstrings left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(getattr(node, "body", None), list) and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                and _SQL.search(node.value):
            found.append(node.value[:60])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "execute", "executemany", "sql", "query"):
            found.append(f".{node.func.attr}( at line {node.lineno}")
    return found


def test_the_sql_finder_finds_sql(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""Reads SELECT nothing (a docstring)."""\nQ = "SELECT id FROM memories WHERE {id}"\n'
                      "def f(con):\n    return con.execute(Q)\n", encoding="utf-8")
    assert _sql_in(sample) == ["SELECT id FROM memories WHERE {id}", ".execute( at line 4"]
    sample.write_text('"""Nothing here."""\nWORDS = "select from where"\n', encoding="utf-8")
    assert _sql_in(sample) == []


def test_stages_hold_no_sql():
    found = {name: sql for name, path in _modules().items()
             if name.startswith("pipeline.stages") and (sql := _sql_in(path))}
    assert found == {}


def test_stages_import_only_the_store_faces_and_the_store_never_imports_stages():
    graph = _graph()
    for name, targets in graph.items():
        if name.startswith("pipeline.stages"):
            store = {t for t in targets if t == "pipeline.store" or t.startswith("pipeline.store.")}
            assert store <= set(STAGE_STORE_IMPORTS), (name, store - set(STAGE_STORE_IMPORTS))
        if name.startswith("pipeline.store"):
            assert not {t for t in targets if t.startswith("pipeline.stages")}, name


def _late_imports(path: Path) -> list[tuple[int, str]]:
    """Imports inside functions without a comment on their line or the line above giving a reason."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import | ast.ImportFrom):
                line, above = lines[inner.lineno - 1], lines[inner.lineno - 2].strip() if inner.lineno > 1 else ""
                if "#" not in line and not above.startswith("#"):
                    out.append((inner.lineno, line.strip()))
    return sorted(set(out))


def test_the_late_import_finder_wants_a_reason(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import json\n\n\ndef g():\n    # heavy: costs a second\n    import csv\n"
                      "    import os  # cheap, but read late on purpose\n", encoding="utf-8")
    assert _late_imports(sample) == [(2, "import json")]


def test_every_function_level_import_in_pipeline_gives_its_reason():
    found = {name: late for name, path in _modules().items() if name.startswith("pipeline")
             and (late := _late_imports(path))}
    assert found == {}


def _runtime_graph(package: str) -> dict[str, set[str]]:
    """Module-level imports as they run: ``if TYPE_CHECKING`` blocks and
    function bodies left out, and importing ``a.b.c`` also runs ``a.b``'s
    ``__init__`` (an edge to each parent package in the project)."""
    modules = {n: p for n, p in _modules().items() if n.startswith(package)}
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        body = [n for n in tree.body if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))]
        top = ast.Module(body=body, type_ignores=[])
        edges = set()
        for target in _imports_of(top, name, path, known):
            parts = target.split(".")
            edges |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = edges - {name} - ancestors
    return graph


def _imports_of(tree: ast.Module, name: str, path: Path, known: set[str]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()
    for node in _outside_functions(tree):
        if isinstance(node, ast.Import):
            edges |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            edges |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names} & known
    return edges


def _outside_functions(node: ast.AST):
    """Every node below ``node`` except what function bodies hold (run later, if ever)."""
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield child
            yield from _outside_functions(child)


def test_no_import_circles_among_pipeline_modules_as_they_run():
    """Stricter than the walk above: a package's ``__init__`` counts, since
    importing any module of it runs that first (the store's faces re-export
    their modules), so a module the face imports may not import back through it."""
    graph = _runtime_graph("pipeline")
    assert graph["pipeline.store.reader"] >= {"pipeline.store.fulltext", "pipeline.store.vector"}
    assert _cycles(graph) == []


def test_every_package_and_data_file_is_installed():
    """A non-editable install gets only what pyproject lists: a new subpackage
    missing from it would import here and fail on a user's machine."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")}
    assert set(config["packages"]) == on_disk
    data = config["package-data"]
    for folder in (ROOT / "pipeline").rglob("*_data"):
        package = ".".join(folder.parent.relative_to(ROOT).parts)
        assert f"{folder.name}/*.json" in data.get(package, []), folder


def _function_imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """The imports inside functions (and methods) of the file at ``path``."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out += [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return out


def _has_reason(lines: list[str], node: ast.stmt) -> bool:
    """A comment on the import's own line(s), or on the line above it or above
    the block of imports it stands in."""
    if any("#" in line for line in lines[node.lineno - 1 : node.end_lineno]):
        return True
    above = node.lineno - 2
    while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def test_the_unexplained_import_finder_finds_one(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    import os\n\n\ndef g():\n    # lazy: costs 1 s\n    import sys\n    import json\n\n\n"
                    "def h():\n    import re  # lazy: a circle\n\n\ndef k():\n    x = 1  # a comment\n    import ast\n",
                    encoding="utf-8")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [n.lineno for n in _function_imports(path) if not _has_reason(lines, n)] == [2, 17]


def test_every_function_level_import_in_workers_says_why():
    """Imports stand at the top of a module, where a reader sees what it depends
    on; one inside a function carries its reason (a measured start-up cost, a
    circle) in a comment on its line or the line above."""
    unexplained = []
    for name, path in _modules().items():
        if not name.startswith("workers"):
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        unexplained += [f"{name}:{n.lineno}" for n in _function_imports(path) if not _has_reason(lines, n)]
    assert unexplained == []


def test_nothing_but_the_command_line_imports_it():
    """``workers.cli`` sits on top: the API, the Celery side and the pipeline
    never import it (its entry point and the tests do)."""
    graph = _graph()
    assert graph["workers.cli.commands"], "the walk sees the command line's imports"
    importers = {name for name, targets in graph.items()
                 if not name.startswith("workers.cli") and any(t == "workers.cli" or t.startswith("workers.cli.")
                                                              for t in targets)}
    assert importers == set()


def test_settings_import_no_other_module_of_the_project():
    """Settings are data: they read the environment and do no I/O of their own
    (where the published store is, the store says)."""
    graph = _graph()
    assert graph["pipeline.settings"] == set()
    assert graph["workers.settings"] == {"pipeline.settings"}
