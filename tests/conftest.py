"""Shared fixtures, and the tiers, one per directory:

- ``tests/unit``: pure functions and single stages, the hash embedder, temp data dirs; no canvas.
- ``tests/embedded``: the query canvas run in-process (no broker), the CLI and the Python API.
- ``tests/integration``: real ``redis-server`` on a free loopback port, real Celery workers, the real model.
- ``tests/slow``: LoCoMo, large fuzzing and scale checks; CI runs them, ``bash ops/test.sh`` does not.

The ``slow`` and ``integration`` markers follow the directory (``-m "not slow"`` selects the rest).
A test elsewhere that costs tens of seconds of a run (its own worker stack
with kills and restarts, ranx compiling on a fresh install) says
``pytest.mark.slow`` itself: the default tier stays under ten minutes.

Under pytest-xdist (``-n 2 --dist loadgroup``, as CI runs), the tests that share
an expensive session fixture run on one worker, so it is built once: the worker
stack (``stack``: redis-server and four Celery workers), the LoCoMo store and
the README's run (``readme_run``: every step of README.md, about 150 s).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pipeline.settings import Settings
from workers.settings import WorkerSettings


def store_settings(tmp_path: Path) -> Settings:
    """Settings for a fresh store (a lake) under tmp_path, with the hash embedder (no model)."""
    return WorkerSettings(data_dir=tmp_path / "data", embedding_model="hash-64", _env_file=None)


def store_env(settings: Settings) -> dict[str, str]:
    """The environment that points a process (the CLI, a subprocess, a worker)
    at ``settings``' store: its data dir and model (and the lake's catalog and
    data path where set), so every part of a test reads one store."""
    env = {"DIMPLE_DATA_DIR": str(settings.data_dir), "DIMPLE_EMBEDDING_MODEL": settings.embedding_model}
    if settings.store.catalog is not None:
        env["DIMPLE_STORE__CATALOG"] = settings.store.catalog
    if settings.store.data_path is not None:
        env["DIMPLE_STORE__DATA_PATH"] = str(settings.store.data_path)
    return env


def use_store(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    """Export ``store_env(settings)`` for this test (undone after it); a
    lake catalog or data path that ``settings`` leaves unset is unset too."""
    env = store_env(settings)
    for name in ("DIMPLE_STORE__ENGINE", "DIMPLE_STORE__CATALOG", "DIMPLE_STORE__DATA_PATH"):
        if name not in env:
            monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings for a fresh store under tmp_path, with the hash embedder (no model)."""
    return store_settings(tmp_path)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def embedded(settings: Settings):
    """Point the in-process (eager) pipeline at ``settings``, whatever an
    earlier test configured (a broker included); release the store afterwards."""
    import workers
    from workers import audit, resources

    workers.configure(settings)
    yield settings
    audit.flush()  # this test's audit rows belong to its data dir
    resources.current().close_store()


@pytest.fixture(autouse=True)
def _no_broker_left_behind():
    """Each test starts with the process embedded: a test that points the
    process-wide app at a broker (and tears that broker down) does not hand it
    to the next test, which under xdist may be any test of another module on
    the same worker (unit tests included); nor its lake's erase check, which
    a write starts and which would otherwise check each next test's store."""
    yield
    upkeep = sys.modules.get("workers.upkeep")
    if upkeep is not None:  # a write started this process's erase check: it would check the next test's store
        upkeep.stop()
    resources = sys.modules.get("workers.resources")
    if resources is None:  # nothing in this process has configured the workers side yet
        return
    settings = resources.current().settings()
    if not settings.embedded:
        import workers

        workers.configure(settings.replace(broker_url="", broker_password="", result_backend=""))


_TIER_MARKS = {"slow": "slow", "integration": "integration"}


# Session fixtures worth building once per run: a test that uses one joins its group.
_SHARED_FIXTURES = {"stack": "stack", "locomo_store": "locomo", "readme_run": "readme"}


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the groups
def pytest_collection_modifyitems(items):
    """Each test carries its directory's tier marker, and the xdist group of the
    shared session fixture it uses (ignored without xdist)."""
    root = Path(__file__).resolve().parent
    for item in items:
        path = Path(str(item.fspath)).resolve()
        parts = path.relative_to(root).parts if path.is_relative_to(root) else ()
        mark = _TIER_MARKS.get(parts[0]) if len(parts) > 1 else None
        if mark:
            item.add_marker(getattr(pytest.mark, mark))
        group = next((g for f, g in _SHARED_FIXTURES.items() if f in getattr(item, "fixturenames", ())), None)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_sessionfinish(session):
    """An xdist worker hands its hardening figures to the controller."""
    from tests import figures

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["figures"] = figures.dump()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The controller adds each worker's hardening figures to its own (xdist only)."""
    from tests import figures

    figures.merge(getattr(node, "workeroutput", {}).get("figures", {}))


def pytest_terminal_summary(terminalreporter):
    """The hardening figures (cases tried, failures) of this run; see SECURITY.md."""
    from tests import figures

    if figures.TALLIES:
        terminalreporter.section("hardening figures")
        for line in figures.lines():
            terminalreporter.write_line(line)
