"""Real parts: a redis-server on a free loopback port, real Celery worker
processes, a real DuckDB file and the real packaged model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from ops.stack import Stack, redis_binary
from pipeline.settings import Settings
from tests.conftest import store_env
from workers.settings import WorkerSettings


@dataclass
class DemoStore:
    settings: Settings
    files: dict[str, Path]

    def with_broker(self, url: str) -> Settings:
        return self.settings.replace(broker_url=url)


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory) -> DemoStore:
    """The demo corpus ingested with the real model into a fresh store."""
    from pipeline.datasets.demo import write_demo
    from workers.cli.common import ingest_file

    data_dir = tmp_path_factory.mktemp("demo-store")
    settings = WorkerSettings(data_dir=data_dir, _env_file=None)
    files = write_demo(data_dir / "files")
    ingest_file(files["memories"], settings, progress=False)
    return DemoStore(settings, files)


@pytest.fixture(scope="session")
def stack(tmp_path_factory, demo_store):
    """redis-server plus one worker each for the embed, search, audit and ingest queues."""
    redis_binary()  # a clear message when redis-server is missing
    from workers.app import app, reconfigure

    run = Stack(tmp_path_factory.mktemp("stack"))
    run.start_redis()
    env = store_env(demo_store.settings)
    try:
        run.start_worker("w-embed", "embed", env=env)
        run.start_worker("w-search", "search", concurrency=2, env=env)
        run.start_worker("w-audit", "audit", env=env)
        run.start_worker("w-ingest", "ingest", concurrency=2, env=env)
        reconfigure(demo_store.with_broker(run.broker_url))
        run.wait_for_workers(app, ["w-embed", "w-search", "w-audit", "w-ingest"], timeout=120)
        yield run
    finally:
        reconfigure(demo_store.settings)
        run.stop_all()


@pytest.fixture(scope="module")
def bare_broker(tmp_path_factory):
    """A redis-server that no worker consumes from."""
    redis_binary()
    run = Stack(tmp_path_factory.mktemp("bare"))
    run.start_redis()
    try:
        yield run
    finally:
        run.stop_all()


@pytest.fixture(autouse=True)
def _back_to_embedded(demo_store):
    """Each test may point the process at a broker; the next starts embedded."""
    yield
    import workers

    workers.configure(demo_store.settings)
