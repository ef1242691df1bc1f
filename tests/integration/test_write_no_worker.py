"""A write through the broker with no ingest worker fails at once and sends
nothing, naming the command that starts one; a write that did go out and was
not acknowledged in time says it may still be applied. With an ingest worker
up, a write finds it in one Redis read (``workers.presence``), without asking
the workers."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import store_env

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_a_write_with_no_ingest_worker_fails_fast_and_sends_nothing(demo_store, bare_broker):
    import workers
    from pipeline.errors import NoWorkerError
    from workers.api import forget, remember

    workers.configure(demo_store.with_broker(bare_broker.broker_url))
    client = redis.Redis.from_url(bare_broker.broker_url)
    for write in (lambda: remember({"namespace": "code", "content": "no worker to take this"}),
                  lambda: forget(["deploy-1"])):
        started = time.monotonic()
        with pytest.raises(NoWorkerError) as info:
            write()
        assert time.monotonic() - started < 10  # ~1 s asking the workers; the write's timeout is 120 s
        assert info.value.queue == "ingest" and "dimple worker --queues ingest" in str(info.value)
        assert "nothing was sent" in str(info.value)
    assert client.llen("ingest") == 0


def test_dimple_forget_with_no_ingest_worker_is_one_line(demo_store, bare_broker):
    env = {**store_env(demo_store.settings), "DIMPLE_BROKER_URL": bare_broker.broker_url,
           "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "workers.cli", "forget", "deploy-1"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no worker is consuming the 'ingest' queue" in lines[0], out.stderr
    assert redis.Redis.from_url(bare_broker.broker_url).llen("ingest") == 0


def test_a_sent_write_that_times_out_says_it_may_still_be_applied(demo_store, bare_broker):
    import workers
    from pipeline.errors import IngestTimeoutError, QueryTimeoutError
    from workers import presence
    from workers.api import remember

    client = redis.Redis.from_url(bare_broker.broker_url)
    key = presence.KEY.format(queue="ingest")
    seconds, _ = client.time()
    client.zadd(key, {"ghost@host": seconds})  # a worker that announced itself, then hung
    try:
        workers.configure(demo_store.with_broker(bare_broker.broker_url).replace(task_timeout_s=1))
        with pytest.raises(IngestTimeoutError) as info:
            remember({"id": "late-1", "namespace": "code", "content": "sent, never taken"})
        assert isinstance(info.value, QueryTimeoutError)  # callers catching the old error still do
        assert "may still be applied" in str(info.value)
        assert client.llen("ingest") == 1  # it went out and waits there
    finally:
        client.delete(key, "ingest")


def test_a_write_finds_the_ingest_worker_without_asking(demo_store, stack, monkeypatch):
    import workers
    from workers import api, presence
    from workers.api import remember

    def no_round_trip(*args, **kwargs):
        raise AssertionError("a write asked the workers which queues they consume")

    workers.configure(demo_store.with_broker(stack.broker_url))
    assert presence.consumes(stack.broker_url, "ingest") is True
    assert presence.consumes(stack.broker_url, "no-such-queue") is False
    monkeypatch.setattr(api, "consumed_queues", no_round_trip)
    assert remember({"id": "presence-1", "namespace": "presence", "content": "found at once"}).ids == ["presence-1"]


def _until(check, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


def test_an_ingest_worker_that_stops_consuming_leaves_the_roster(demo_store, stack):
    """The RUNBOOK's drain (``cancel_consumer ingest``): writes are refused at
    once again, as before presence; ``add_consumer`` brings it back."""
    import socket

    import workers
    from pipeline.errors import NoWorkerError
    from workers import presence
    from workers.api import remember
    from workers.app import get_app

    workers.configure(demo_store.with_broker(stack.broker_url))
    node = [f"w-ingest@{socket.gethostname()}"]
    assert presence.consumes(stack.broker_url, "ingest") is True
    get_app().control.cancel_consumer("ingest", destination=node, reply=True)
    try:
        assert _until(lambda: presence.consumes(stack.broker_url, "ingest") is False, 4 * presence.EVERY_S)
        with pytest.raises(NoWorkerError):
            remember({"namespace": "drain", "content": "not while draining"})
    finally:
        get_app().control.add_consumer("ingest", destination=node, reply=True)
    assert _until(lambda: presence.consumes(stack.broker_url, "ingest") is True, 4 * presence.EVERY_S)
