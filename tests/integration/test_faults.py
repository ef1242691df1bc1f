"""Faults with real processes and the DEFAULT settings (visibility timeout,
task timeout): a search worker's main process SIGKILLed mid-batch while a
second one is up, Redis restarted during a batch of 500 queries, a query its
caller gave up on (its stages expire unrun)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import redis

from ops.stack import Stack
from pipeline import audit as pa
from pipeline.contracts import Results
from pipeline.errors import BrokerUnavailableError, DimpleError, QueryTimeoutError, StageLostError
from tests.conftest import store_env
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # stacks of their own, hundreds of queries, kills: ~75 s


def _asks(demo, n):
    lines = demo.files["queries"].read_text(encoding="utf-8").splitlines()
    qs = [json.loads(l) for l in lines if l.strip()]
    return [{"query": f"{qs[i % len(qs)]['text']} {i}", "namespace": qs[i % len(qs)].get("namespace")}
            for i in range(n)]


def _received(run: Stack, name: str) -> int:
    """Stage messages worker ``name`` has received so far (its log's INFO lines)."""
    log = run.run_dir / f"{name}.log"
    return log.read_text(errors="replace").count("] received") if log.exists() else 0


def _holding(run: Stack, name: str) -> bool:
    """Whether worker ``name`` holds a stage now (received more than it finished, by its log)."""
    log = run.run_dir / f"{name}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return text.count("] received") > text.count("] succeeded in ") + text.count("] raised ")


def _nothing_left(url: str, timeout: float = 10.0) -> dict[str, int]:
    """Wait until no message is queued or held unacknowledged; returns what is left."""
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    while True:
        left = {"unacked": client.hlen("unacked"), **{q: client.llen(q) for q in ("embed", "search")}}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.fixture
def fault_stack(demo_store, tmp_path_factory):
    """Redis, an embed worker and two search workers, all with default settings."""
    import workers
    from workers.app import reconfigure

    run = Stack(tmp_path_factory.mktemp("faults"))
    run.start_redis()
    env = store_env(demo_store.settings)
    settings = demo_store.with_broker(run.broker_url)
    assert settings == WorkerSettings(data_dir=settings.data_dir, broker_url=run.broker_url, _env_file=None)
    run.env_for_workers = env
    run.settings = settings
    try:
        run.start_worker("x-embed", "embed", env=env)
        run.start_worker("x-search", "search", env=env)
        run.start_worker("x-search2", "search", env=env)
        workers.configure(settings)
        from workers.app import app

        run.wait_for_workers(app, ["x-embed", "x-search", "x-search2"], timeout=120)
        yield run
    finally:
        workers.configure(demo_store.settings)
        reconfigure(demo_store.settings)
        run.stop_all()


def _gone_at(url: str, tags: set[bytes], out: dict, timeout: float = 60.0) -> None:
    """Record in ``out["gone"]`` when none of ``tags`` is held unacknowledged any more."""
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not tags & set(client.hkeys("unacked")):
            out["gone"] = time.monotonic()
            return
        time.sleep(0.1)


def test_search_worker_main_process_killed_during_500_queries(demo_store, fault_stack):
    """The killed worker's held stages come back within the visibility timeout
    (its lease lapses; workers/leases.py) and the second worker runs them:
    every query is answered within 15 s of the kill, and nothing is left to
    run after the answers are in."""
    import workers
    from workers.api import search_many

    asks = _asks(demo_store, 500)
    workers.configure(fault_stack.settings)
    t0 = time.monotonic()
    expected = [[r.id for r in res.results] for res in search_many(asks)]  # no fault: the answers, and the time
    unhurt = time.monotonic() - t0
    out: dict = {}
    runner = threading.Thread(target=lambda: out.update(res=search_many(asks, return_exceptions=True),
                                                        done=time.monotonic()))
    runner.start()
    deadline = time.monotonic() + 60
    while not _holding(fault_stack, "x-search") and time.monotonic() < deadline:
        time.sleep(0.005)
    assert runner.is_alive(), "the batch finished before the kill; make it bigger"
    os.kill(fault_stack.procs["x-search"].pid, signal.SIGKILL)  # the main process only, as the OOM killer would
    killed = time.monotonic()
    held = set(redis.Redis.from_url(fault_stack.broker_url).hkeys("unacked"))
    time.sleep(2)  # live workers ack theirs within milliseconds; what is still held was the dead worker's
    lost = held & set(redis.Redis.from_url(fault_stack.broker_url).hkeys("unacked"))
    assert lost, "the killed worker held no message: nothing was lost, the test shows nothing"
    watch: dict = {}
    watcher = threading.Thread(target=_gone_at, args=(fault_stack.broker_url, lost, watch))
    watcher.start()
    runner.join(60)
    watcher.join(60)
    assert not runner.is_alive(), "hung long past the kill"
    took, back = out["done"] - killed, watch["gone"] - killed
    results = out["res"]
    answered = [r for r in results if isinstance(r, Results)]
    print(f"\n500 queries, search worker main process SIGKILLed: {len(answered)} answered, "
          f"{len(results) - len(answered)} failed, all within {took:.1f} s of the kill "
          f"(the same 500 unhurt: {unhurt:.1f} s); the {len(lost)} message(s) it held were back on a live "
          f"worker after {back:.1f} s")
    assert back < fault_stack.settings.visibility_timeout_s + 3
    # the goal (15 s) holds where the machine answers the batch unhurt in under 8 s; a busier one
    # (a shared CI runner) still must not take more than the lost lease's delay on top of the batch
    # run on what is left: one search worker of two, so at worst twice its unhurt time
    assert took < max(15.0, 2 * unhurt + fault_stack.settings.visibility_timeout_s + 3)
    assert len(answered) == 500, [str(r) for r in results if not isinstance(r, Results)][:3]
    assert [[r.id for r in res.results] for res in answered] == expected
    # nothing queued or held is left to run later; the survivor receives nothing more
    assert _nothing_left(fault_stack.broker_url) == {"unacked": 0, "embed": 0, "search": 0}
    before = _received(fault_stack, "x-search2")
    time.sleep(fault_stack.settings.visibility_timeout_s + 3)
    assert _received(fault_stack, "x-search2") == before, "a stage ran after its query was answered"


def test_redis_restart_during_500_queries_fails_them_at_once(demo_store, fault_stack):
    """Redis restarted empty mid-batch: each query is answered or fails within
    seconds, naming what happened (broker lost, or its stages lost), never
    by waiting out the 120 s timeout; the next batch is answered in full."""
    import workers
    from workers.api import search_many

    workers.configure(fault_stack.settings)
    out: dict = {}
    runner = threading.Thread(
        target=lambda: out.update(res=search_many(_asks(demo_store, 500), batch_size=20, return_exceptions=True),
                                  done=time.monotonic()))
    runner.start()
    deadline = time.monotonic() + 60
    while _received(fault_stack, "x-search") + _received(fault_stack, "x-search2") < 20 \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    fault_stack.stop("redis", sig=signal.SIGKILL)
    time.sleep(0.5)
    fault_stack.start_redis()  # same port, empty: queued messages and results are gone
    back = time.monotonic()
    runner.join(fault_stack.settings.task_timeout_s + 30)
    assert not runner.is_alive(), "hung past the caller's timeout"
    results = out["res"]
    assert len(results) == 500
    answered = sum(isinstance(r, Results) for r in results)
    failed = [r for r in results if isinstance(r, DimpleError)]
    assert answered + len(failed) == 500  # each query answered or reported failed, none dropped
    assert failed, "the restart really lost work"
    assert all(isinstance(e, BrokerUnavailableError) and not isinstance(e, QueryTimeoutError) for e in failed)
    lost = sum(isinstance(e, StageLostError) for e in failed)
    assert all(str(e).startswith("queries[") for e in failed)  # each error names its query
    took = out["done"] - back
    print(f"\nredis restarted mid-batch: {answered} answered, {len(failed)} failed ({lost} as stages lost), "
          f"all within {took:.1f} s of the restart")
    assert took < 15
    # the stack serves again afterwards, with the default timeout intact
    again = search_many(_asks(demo_store, 40), batch_size=10, return_exceptions=True)
    assert all(isinstance(r, Results) for r in again), [str(r) for r in again if not isinstance(r, Results)][:3]


def test_a_query_its_caller_gave_up_on_never_runs_later(demo_store, bare_broker, tmp_path):
    """Sent with no worker up, timed out: its stages expire at its deadline,
    and a worker started afterwards discards them unrun (no audit row)."""
    import workers
    from workers.api import search_async
    from workers.app import app

    data = tmp_path / "data"  # a store of its own, empty: no stage may run, so what it holds does not matter
    data.mkdir()
    settings = WorkerSettings(data_dir=data, broker_url=bare_broker.broker_url, task_timeout_s=2, _env_file=None)
    workers.configure(settings)
    handle = search_async("deploy window")
    with pytest.raises(QueryTimeoutError):
        handle.get(timeout=2)
    handle.release()
    time.sleep(1)  # past its deadline
    env = {"DIMPLE_DATA_DIR": str(data)}
    bare_broker.start_worker("late-embed", "embed", env=env)
    bare_broker.start_worker("late-search", "search", env=env)
    bare_broker.start_worker("late-audit", "audit", env=env)
    bare_broker.wait_for_workers(app, ["late-embed", "late-search", "late-audit"], timeout=120)
    assert _nothing_left(bare_broker.broker_url) == {"unacked": 0, "embed": 0, "search": 0}
    # a message leaves the queue before it is recorded as held, and the discard is logged after:
    # the logs within a bound
    deadline = time.monotonic() + 30
    while "Discarding revoked task" not in (logs := "".join(
            (bare_broker.run_dir / f"{n}.log").read_text() for n in ("late-embed", "late-search"))):
        assert time.monotonic() < deadline, "no stage was discarded as revoked"
        time.sleep(0.2)
    assert " succeeded in " not in logs  # no stage ran
    assert pa.count(pa.log_of(settings)) == (0, 0)  # no audit row: an answered query, even on an empty store, has one


@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
def test_a_caller_still_waiting_learns_its_stages_expired_unrun(demo_store, tmp_path, mode):
    """The same, asked again after workers came up: the caller learns that
    its stages expired unrun, whether its canvas is one chain (one leg:
    the discarded stage is a parent of the answer it waits for) or a chord
    (two legs: the discarded parts fail the chord's body). A redis-server
    of its own: no worker an earlier test started may take the stages."""
    import workers
    from workers.api import search_async
    from workers.app import app, reconfigure

    data = tmp_path / "data"
    data.mkdir()
    run = Stack(tmp_path / "stack")
    run.start_redis()
    try:
        workers.configure(WorkerSettings(data_dir=data, broker_url=run.broker_url, task_timeout_s=2, _env_file=None))
        handle = search_async("deploy window", mode=mode)
        with pytest.raises(QueryTimeoutError, match="no answer"):
            handle.get(timeout=2)
        time.sleep(1)  # past its deadline
        names = ["gone-search"] + (["gone-embed"] if mode == "hybrid" else [])
        for name in names:
            run.start_worker(name, name.partition("-")[2], env={"DIMPLE_DATA_DIR": str(data)})
        run.wait_for_workers(app, names, timeout=120)
        with pytest.raises(QueryTimeoutError, match="expired unrun at the query's deadline"):
            handle.get(timeout=30)
        assert _nothing_left(run.broker_url) == {"unacked": 0, "embed": 0, "search": 0}
    finally:
        reconfigure(demo_store.settings)
        run.stop_all()


def test_a_write_lost_with_redis_fails_at_once(demo_store, fault_stack):
    """A write queued (no ingest worker takes it) when Redis restarts empty:
    its caller learns at once that it was lost, not after DIMPLE_TASK_TIMEOUT_S."""
    import redis

    import workers
    from workers import presence
    from workers.api import remember_async

    workers.configure(fault_stack.settings)
    client = redis.Redis.from_url(fault_stack.broker_url)
    # an ingest worker that announced itself and then hung: the write is sent and waits in the queue
    client.zadd(presence.KEY.format(queue="ingest"), {"hung@host": client.time()[0]})
    handle = remember_async({"namespace": "faults", "content": "a write Redis will lose"})
    fault_stack.stop("redis", sig=signal.SIGKILL)
    fault_stack.start_redis()
    t0 = time.monotonic()
    with pytest.raises(StageLostError, match="was lost: the broker restarted without its data"):
        handle.get(timeout=fault_stack.settings.task_timeout_s)
    assert time.monotonic() - t0 < 10
