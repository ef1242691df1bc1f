"""Benchmarks; each prints ratios against a baseline measured in the same run."""

from __future__ import annotations

import logging
from pathlib import Path


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
