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


def test_a_message_that_changed_nothing_delivered_again_after_a_later_write_changes_nothing(demo_store, stack):
    """A broker message is delivered again when its worker dies before the
    ack, after later messages ran. One that found nothing to change (a
    forget of an id not yet written) commits nothing to the lake: delivered
    again, it is answered as the replay of its stored answer, not applied
    over the write made since. (Sent again here under its task id, as a
    redelivery carries it.)"""
    import workers
    from workers.api import get, remember
    from workers.app import get_app

    workers.configure(demo_store.with_broker(stack.broker_url))
    app = get_app()
    forget = app.tasks["ingest.forget"]
    first = forget.apply_async(args=[["rd-later"]], task_id="rd-forget-before").get(timeout=60)
    assert first["not_found"] == ["rd-later"] and not first["replayed"]
    done = remember({"id": "rd-later", "namespace": "redeliver", "content": "written after the forget"})
    forget.apply_async(args=[["rd-later"]], task_id="rd-forget-before")
    # the result backend keeps a task id's first success: the second run's answer is read in the log
    deadline = time.monotonic() + 60
    while len(runs := [line for line in (stack.run_dir / "w-ingest.log").read_text(errors="replace").splitlines()
                       if "ingest.forget[rd-forget-before] succeeded" in line]) < 2:
        assert time.monotonic() < deadline, "the message sent again was not run"
        time.sleep(0.1)
    assert "'replayed': True" in runs[1] and "'replayed': False" in runs[0]
    assert [m["id"] for m in get(["rd-later"], min_version=done.version)] == ["rd-later"]

