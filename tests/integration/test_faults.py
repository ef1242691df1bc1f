"""Faults with real processes: a search worker killed mid-batch, Redis
restarted during a batch of 500 queries."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from ops.stack import Stack
from pipeline.contracts import Results
from pipeline.errors import DimpleError

pytestmark = pytest.mark.integration


def _asks(demo, n):
    lines = demo.files["queries"].read_text(encoding="utf-8").splitlines()
    qs = [json.loads(l) for l in lines if l.strip()]
    return [{"query": qs[i % len(qs)]["text"], "namespace": qs[i % len(qs)].get("namespace")} for i in range(n)]


@pytest.fixture
def fault_stack(demo_store, tmp_path_factory):
    import workers
    from workers.app import reconfigure

    run = Stack(tmp_path_factory.mktemp("faults"))
    run.start_redis()
    env = {"DIMPLE_DATA_DIR": str(demo_store.settings.data_dir), "DIMPLE_VISIBILITY_TIMEOUT_S": "4"}
    settings = demo_store.with_broker(run.broker_url).replace(visibility_timeout_s=4, task_timeout_s=90)
    run.env_for_workers = env
    run.settings = settings
    try:
        run.start_worker("x-embed", "embed", env=env)
        run.start_worker("x-search", "search", env=env)
        workers.configure(settings)
        from workers.app import app

        run.wait_for_workers(app, ["x-embed", "x-search"], timeout=120)
        yield run
    finally:
        workers.configure(demo_store.settings)
        reconfigure(demo_store.settings)
        run.stop_all()


def test_search_worker_killed_mid_batch_still_answers(demo_store, fault_stack):
    import workers
    from workers.api import search_many

    asks = _asks(demo_store, 200)
    workers.configure(demo_store.settings)
    expected = [[r.id for r in res.results] for res in search_many(asks, batch_size=10)]
    workers.configure(fault_stack.settings)
    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(res=search_many(asks, batch_size=10)))
    t0 = time.monotonic()
    runner.start()
    time.sleep(1.5)
    assert runner.is_alive(), "the batch finished before the kill; make it bigger"
    fault_stack.stop("x-search", sig=signal.SIGKILL)
    fault_stack.start_worker("x-search2", "search", env=fault_stack.env_for_workers)
    runner.join(120)
    assert not runner.is_alive(), "hung past the caller's timeout"
    results = out["res"]
    assert len(results) == 200
    assert [[r.id for r in res.results] for res in results] == expected
    print(f"\nbatch of 200 with a search worker SIGKILLed: answered in {time.monotonic() - t0:.1f} s")


def test_redis_restart_during_500_queries_drops_nothing_silently(demo_store, fault_stack):
    import workers
    from workers.api import search_many

    workers.configure(fault_stack.settings.replace(task_timeout_s=30))
    out: dict = {}
    runner = threading.Thread(
        target=lambda: out.update(res=search_many(_asks(demo_store, 500), batch_size=20, return_exceptions=True))
    )
    runner.start()
    time.sleep(1.0)
    fault_stack.stop("redis")
    time.sleep(0.5)
    fault_stack.start_redis()  # same port, empty: queued messages and results are gone
    runner.join(120)
    assert not runner.is_alive(), "hung past the caller's timeout"
    results = out["res"]
    assert len(results) == 500
    answered = sum(isinstance(r, Results) for r in results)
    failed = sum(isinstance(r, DimpleError) for r in results)
    assert answered + failed == 500  # each query answered or reported failed, none dropped
    assert failed > 0  # the restart really lost work
    print(f"\nredis restarted mid-batch: {answered} answered, {failed} reported failed")
    # and the stack serves again afterwards
    workers.configure(fault_stack.settings)
    again = search_many(_asks(demo_store, 20), batch_size=10)
    assert len(again) == 20
