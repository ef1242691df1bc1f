"""Any item on a queue: a worker survives it (workers/celery_compat.py
``guard_queue_items``). 100 raw items of 20 kinds go onto every queue of the
running stack; afterwards every worker is alive and answers, queries and a
write through the broker succeed."""

from __future__ import annotations

import base64
import json
import uuid

import pytest
import redis

pytestmark = pytest.mark.integration


def _envelope(task: str | None, body: bytes, content_type: str = "application/json", **extra_props) -> str:
    headers = {"task": task, "id": str(uuid.uuid4()), "lang": "py", "argsrepr": "", "kwargsrepr": ""} if task else {}
    return json.dumps({
        "body": base64.b64encode(body).decode(), "content-encoding": "utf-8", "content-type": content_type,
        "headers": headers,
        "properties": {"delivery_tag": str(uuid.uuid4()), "body_encoding": "base64", "priority": 0,
                       "delivery_info": {"exchange": "", "routing_key": "x"}, **extra_props},
    })


def hostile_items() -> list[bytes | str]:
    deep = "[" * 5000 + "]" * 5000
    return [
        "not json", "", " ", "[1,2,3]", "{}", "null", "123", '"a string"', '{"body": 5}',
        '{"properties": []}', '{"properties": {"delivery_tag": 5}}',
        json.dumps({"body": "!!!", "properties": {"delivery_tag": "t", "body_encoding": "base64"}}),
        b"\xff\xfe\x00 not utf-8", deep, "x" * 1_000_000,
        _envelope("no.such.task", b"[[], {}, {}]"),
        _envelope("search.fuse", b"not json at all"),
        _envelope("search.fuse", json.dumps([[None], {}, {}]).encode()),
        _envelope("audit.write", json.dumps([[{"query_id": 5}], {}, {}]).encode()),
        _envelope("search.budget", b"\x80\x04K\x01.", content_type="application/x-python-serialize"),
    ]


def test_workers_survive_100_hostile_items_on_every_queue(demo_store, stack):
    import workers
    from workers.api import remember, search
    from workers.app import app

    workers.configure(demo_store.with_broker(stack.broker_url))
    assert search("deploy window").results
    client = redis.Redis.from_url(stack.broker_url)
    items = hostile_items()
    assert len(items) == 20
    for queue in ("embed", "search", "audit", "ingest"):
        for _ in range(5):
            for item in items:
                client.lpush(queue, item)
    # every worker drains its queue and is still there
    names = ["w-embed", "w-search", "w-audit", "w-ingest"]
    import time

    deadline = time.time() + 60
    while time.time() < deadline and any(client.llen(q) for q in ("embed", "search", "audit", "ingest")):
        time.sleep(0.2)
    assert not any(client.llen(q) for q in ("embed", "search", "audit", "ingest")), "items left on a queue"
    for name in names:
        assert stack.procs[name].poll() is None, f"worker {name} exited"
    stack.wait_for_workers(app, names, timeout=30)
    for q in ("deploy window", "ERR_CONN_RESET", "vegetarian restaurants"):
        assert search(q).results
    done = remember({"namespace": "queue-items", "content": "written after hostile items ZQ_AFTER_ITEMS"})
    assert done.inserted == 1
    log = (stack.run_dir / "w-search.log").read_text(errors="replace")
    assert "not a message was refused" in log


def test_the_sender_of_a_refused_message_is_told_at_once(demo_store, stack):
    """A pickled message (Celery refuses to decode it) and an item whose
    envelope is broken but names its task id: each sender's get() raises a
    StageError naming why within seconds, not at its timeout."""
    import time

    from celery.result import AsyncResult

    import workers
    from pipeline.errors import StageError
    from workers.api import search
    from workers.app import app

    workers.configure(demo_store.with_broker(stack.broker_url))
    pickled = app.send_task("search.budget", args=[{"states": []}], serializer="pickle")
    broken_id = str(uuid.uuid4())
    redis.Redis.from_url(stack.broker_url).lpush("search", json.dumps({
        "body": "!!! not base64", "headers": {"id": broken_id, "task": "search.fuse"},
        "properties": {"delivery_tag": str(uuid.uuid4()), "body_encoding": "base64"}}))
    for task_id, why in ((pickled.id, "could not decode it"), (broken_id, "body is not base64")):
        t0 = time.monotonic()
        with pytest.raises(Exception) as info:
            AsyncResult(task_id, app=app).get(timeout=30)
        assert time.monotonic() - t0 < 10
        assert isinstance(info.value, StageError) or type(info.value).__name__ == "StageError"
        assert why in str(info.value) and "was not run" in str(info.value)
    assert search("deploy window").results  # and the workers serve on
