"""Benchmarks; each prints ratios against a baseline measured in the same run."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.settings import Settings


def embedded_demo(work: Path):
    """Quiet logs, the demo store under ``work`` (built if absent), the process
    pointed at it embedded. Returns ``(settings, queries)``."""
    import workers
    from workers.cli.demo import build_demo_store, demo_settings, load_queries
    from workers.settings import WorkerSettings

    logging.getLogger("dimple").setLevel(logging.WARNING)
    logging.getLogger("celery").setLevel(logging.WARNING)
    settings = demo_settings(WorkerSettings(_env_file=None).replace(data_dir=work))
    workers.configure(settings)
    queries, _ = load_queries(build_demo_store(settings))
    return settings, queries


def emit(report: dict, out=None) -> None:
    """Print a benchmark's report as JSON, and write it to ``out`` (a path) when given."""
    import json

    text = json.dumps(report, indent=1)
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


@contextmanager
def postgres_lake(conninfo: str, folder: Path) -> Iterator[Settings]:
    """Settings for a lake on a PostgreSQL catalog: a database made on the
    server ``conninfo`` names (without ``dbname``) for the run, dropped after;
    the data dir and data path under ``folder``."""
    from pipeline.settings import Settings
    from tests.lakes import Postgres

    server = Postgres(f"dbname=postgres {conninfo}", conninfo)
    database = server.create_database()
    try:
        yield Settings(data_dir=folder / "pg", store={"catalog": f"postgres:{database}", "data_path": folder / "pg-data"},
                       _env_file=None)
    finally:
        server.drop_database(database)
