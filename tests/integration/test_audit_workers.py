"""Audit through real workers: exactly one row per query (the same while the
audit worker is SIGKILLed again and again and Redis restarts empty:
``test_audit_durability.py``)."""

from __future__ import annotations

import json
import time

import pytest

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


def _outbox_left(*settings, within: float = 30.0) -> list:
    """The outbox files on the hosts of ``settings`` once there are none, or
    ``within`` seconds on: a file goes just after its rows commit (the rows may
    be read in between), and one a killed audit worker left (its rows in)
    goes at the next worker's drain, once a few seconds old."""
    deadline = time.time() + within
    while True:
        left = [p for s in settings for p in s.audit_outbox_dir.glob("*.json")]
        if not left or time.time() > deadline:
            return left
        time.sleep(0.2)


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
    total, distinct, missing = _ids_logged(pa.log_of(demo_store.settings), ids, timeout=60)
    assert not missing
    assert total == distinct  # never a second row for a query
