"""Shared fixtures. Unit tests use the hash embedder and a temp data dir;
integration tests (tests/integration) use the real model and real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings for a fresh store under tmp_path, with the hash embedder (no model)."""
    return Settings(data_dir=tmp_path / "data", embedding_model="hash-64", _env_file=None)


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
    resources.close_store()


def pytest_terminal_summary(terminalreporter):
    """The hardening figures (cases tried, failures) of this run; see SECURITY.md."""
    from tests import figures

    if figures.TALLIES:
        terminalreporter.section("hardening figures")
        for line in figures.lines():
            terminalreporter.write_line(line)
