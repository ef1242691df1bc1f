"""The layout shows the architecture: no import circles, pure stages, one file per seed stage."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "workers", "schema")
# The seed's boxes, each in a file of pipeline/stages named after it; all but
# recency are tasks named search.<stage> (the recency boost is applied inside
# search.fuse: it re-ranks the fused list, and a hop of its own would cost a message).
SEED_STAGES = ("embed", "descend", "fulltext", "fuse", "recency", "augment", "scope", "budget")
TASK_STAGES = tuple(s for s in SEED_STAGES if s != "recency")


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


def test_each_seed_stage_is_a_task_in_a_file_named_after_it():
    from workers.app import get_app

    names = {name for name in get_app().tasks if name.startswith("search.")}
    assert names == {f"search.{stage}" for stage in TASK_STAGES}
    for stage in SEED_STAGES:
        assert (ROOT / "pipeline" / "stages" / f"{stage}.py").is_file(), stage


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
