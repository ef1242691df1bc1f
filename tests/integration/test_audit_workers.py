"""Audit through real workers: exactly one row per query, also while the
audit worker is SIGKILLed again and again."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from ops.stack import Stack
from pipeline import audit as pa

pytestmark = pytest.mark.integration


def _ids_logged(path, ids: set[str], timeout: float) -> tuple[int, int, set[str]]:
    """Wait until every id has its row; returns (rows, distinct, missing)."""
    deadline = time.time() + timeout
    while True:
        rows = {r.query_id for r in pa.tail(path, 100_000)}
        missing = ids - rows
        if not missing or time.time() > deadline:
            total, distinct = pa.count(path)
            return total, distinct, missing
        time.sleep(0.5)


def _asks(demo, n):
    lines = demo.files["queries"].read_text(encoding="utf-8").splitlines()
    qs = [json.loads(l) for l in lines if l.strip()]
    return [{"query": qs[i % len(qs)]["text"], "namespace": qs[i % len(qs)].get("namespace")} for i in range(n)]


def test_one_row_per_query_through_workers(demo_store, stack):
    import workers
    from workers.api import search_many

    workers.configure(demo_store.with_broker(stack.broker_url))
    results = search_many(_asks(demo_store, 300), batch_size=25)
    ids = {r.query_id for r in results}
    total, distinct, missing = _ids_logged(demo_store.settings.audit_path, ids, timeout=60)
    assert not missing
    assert total == distinct  # never a second row for a query


def test_audit_worker_killed_during_1000_queries(demo_store, tmp_path_factory):
    """SIGKILL the audit worker three times mid-run: afterwards every query has exactly one row."""
    import workers
    from pipeline.settings import Settings
    from workers.app import app, reconfigure

    data = tmp_path_factory.mktemp("audit-fault")
    (data / "store.duckdb").symlink_to(demo_store.settings.store_path)
    env = {"DIMPLE_DATA_DIR": str(data), "DIMPLE_VISIBILITY_TIMEOUT_S": "4", "DIMPLE_AUDIT_BACKOFF_BASE_S": "0.2"}
    run = Stack(tmp_path_factory.mktemp("stack-fault"))
    run.start_redis()
    settings = Settings(data_dir=data, broker_url=run.broker_url, visibility_timeout_s=4, _env_file=None)
    try:
        run.start_worker("f-embed", "embed", env=env)
        run.start_worker("f-search", "search", concurrency=2, env=env)
        run.start_worker("f-audit", "audit", env=env)
        workers.configure(settings)
        run.wait_for_workers(app, ["f-embed", "f-search", "f-audit"], timeout=90)
        from workers.api import search_many

        out: dict = {}
        runner = threading.Thread(target=lambda: out.update(res=search_many(_asks(demo_store, 1000), batch_size=20)))
        runner.start()
        kills = 0
        while runner.is_alive() and kills < 3:
            time.sleep(2.0)
            run.stop("f-audit", sig=signal.SIGKILL)
            kills += 1
            run.start_worker("f-audit", "audit", env=env)
        runner.join(timeout=600)
        assert kills == 3, "the query run ended before the audit worker could be killed three times"
        results = out["res"]
        assert len(results) == 1000
        ids = {r.query_id for r in results}
        total, distinct, missing = _ids_logged(settings.audit_path, ids, timeout=120)
        assert not missing, f"{len(missing)} queries have no audit row"
        assert total == distinct == 1000
    finally:
        workers.configure(demo_store.settings)
        reconfigure(demo_store.settings)
        run.stop_all()
