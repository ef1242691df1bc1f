"""A query that times out says which of its queues no worker consumes; an
answered query never asks the workers anything (no round trip per query)."""

from __future__ import annotations

import re
import time

import pytest

pytestmark = pytest.mark.integration


def test_a_timeout_names_the_queues_nobody_consumes(demo_store, bare_broker):
    import workers
    from pipeline.errors import QueryTimeoutError
    from workers.api import search

    workers.configure(demo_store.with_broker(bare_broker.broker_url).replace(task_timeout_s=1))
    started = time.perf_counter()
    with pytest.raises(QueryTimeoutError) as info:
        search("deploy window")
    elapsed = time.perf_counter() - started
    message = str(info.value)
    assert re.search(r"within \d+\.\d s of sending it; no worker is consuming the 'embed' and 'search' queues", message)
    assert "start: dimple worker --queues embed; dimple worker --queues search --concurrency 2" in message
    assert elapsed < 10  # generous: the 1 s timeout plus ~1 s asking the workers


def test_an_answered_query_does_not_ask_who_consumes(demo_store, stack, monkeypatch):
    import workers
    from workers import api
    from workers.api import search, search_many

    def no_round_trip(*args, **kwargs):
        raise AssertionError("an answered query asked the workers which queues they consume")

    monkeypatch.setattr(api, "consumed_queues", no_round_trip)
    workers.configure(demo_store.with_broker(stack.broker_url))
    assert search("deploy window").results
    assert all(r.results for r in search_many(["deploy window", "rollback"], batch_size=1))


def test_get_with_no_worker_to_answer_times_out_naming_the_queue(demo_store, bare_broker):
    """``get`` through a broker no search worker consumes: a typed timeout
    naming the queue and what to start, as a query's, not Celery's own."""
    import workers
    from pipeline.errors import QueryTimeoutError
    from workers.api import get

    workers.configure(demo_store.with_broker(bare_broker.broker_url).replace(task_timeout_s=1))
    with pytest.raises(QueryTimeoutError) as info:
        get(["m1"])
    assert re.search(r"within \d+\.\d s of sending it; no worker is consuming the 'search' queue", str(info.value))


def test_get_without_a_timeout_ends_at_the_deadline_when_no_worker_consumes(demo_store, bare_broker):
    """``search_async(...).get()`` with no timeout, and no worker for its
    queues: it ends once the query's deadline (``task_timeout_s`` after
    sending) has passed, with the typed timeout naming the queues, instead of
    waiting forever for stages nobody will run (a worker started later
    discards them unrun)."""
    import threading

    import workers
    from pipeline.errors import QueryTimeoutError
    from workers.api import search_async

    workers.configure(demo_store.with_broker(bare_broker.broker_url).replace(task_timeout_s=1))
    handle = search_async("deploy window", mode="keyword")
    outcome: list[BaseException | object] = []

    def wait() -> None:
        try:
            outcome.append(handle.get())
        except BaseException as exc:  # noqa: BLE001 - what get() ended with is the assertion
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    started = time.perf_counter()
    waiter.start()
    waiter.join(20)
    assert not waiter.is_alive(), "get() with no timeout still waiting 20 s after a 1 s deadline"
    assert time.perf_counter() - started >= 0.5  # not before the deadline (sent just before)
    (error,) = outcome
    assert isinstance(error, QueryTimeoutError)
    # at the deadline, plus the ask of who consumes (about a second; more under load)
    assert re.search(r"no answer for task \S+ within \d+\.\d s of sending it; "
                     r"no worker is consuming the 'search' queue", str(error))
