"""The write API through the broker: ``remember`` / ``forget`` travel on the
``ingest`` queue to a real worker, come back as a typed ``WriteResult`` from
an ``AsyncResult``, and are visible to the query workers (other processes) at
their next task; many callers write at once and none is refused."""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.integration


def _until_visible(search, text: str, namespace: str, want: set[str], within: float = 10.0) -> float:
    # a liveness bound: each search process looks for new writes every store.poll_ms
    start = time.perf_counter()
    while True:
        got = {r.id for r in search(text, mode="keyword", namespace=namespace, max_units=50).results}
        if got == want:
            return time.perf_counter() - start
        assert time.perf_counter() - start < within, f"{got} != {want} within {within} s"


def test_remember_and_forget_through_the_ingest_worker(demo_store, stack):
    import workers
    from pipeline.errors import IngestValidationError
    from workers.api import WriteResult, forget, get, remember, remember_async, search

    workers.configure(demo_store.with_broker(stack.broker_url))
    handle = remember_async({"id": "wa-1", "namespace": "write-api", "content": "rollback plan ZQ_WRITE_1 for web-7"})
    from celery.result import AsyncResult

    assert isinstance(handle, AsyncResult)
    done = handle.get(timeout=60)
    assert isinstance(done, WriteResult) and done.ids == ["wa-1"] and done.inserted == 1 and done.version is not None
    _until_visible(search, "ZQ_WRITE_1", "write-api", {"wa-1"})
    # read-your-writes: the write's version, whichever search process answers (the other may not have looked yet)
    assert get(["wa-1"], min_version=done.version)[0]["content"].startswith("rollback plan")
    with pytest.raises(IngestValidationError) as info:  # the worker checks edges against the store
        remember({"namespace": "write-api", "content": "points nowhere", "supersedes": ["no-such-id"]})
    assert "record 1: supersedes" in str(info.value)
    gone = forget(["wa-1"], reason="test")
    assert gone.forgotten == 1
    _until_visible(search, "ZQ_WRITE_1", "write-api", set())
    assert get(["wa-1"], min_version=gone.version) == []


def test_many_callers_write_at_once_and_none_is_refused(demo_store, stack):
    import workers
    from workers.api import remember, search

    workers.configure(demo_store.with_broker(stack.broker_url))
    errors: list[str] = []

    def caller(n: int) -> None:
        try:
            for i in range(3):
                remember({"id": f"mc-{n}-{i}", "namespace": "write-many", "content": f"concurrent ZQ_MANY note {n} {i}"})
        except Exception as exc:  # noqa: BLE001 - every failure counts
            errors.append(repr(exc))

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    want = {f"mc-{n}-{i}" for n in range(4) for i in range(3)}
    _until_visible(search, "ZQ_MANY", "write-many", want)
