"""The DuckDB process model with real processes: query workers keep reading
while the ingest worker writes, and what it acknowledges becomes visible to
them without a restart. ``dimple ingest --via-broker`` refuses at once when no
worker consumes the ingest queue, and a batch that times out is accounted for."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import redis

pytestmark = pytest.mark.integration


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_ingest_via_broker_is_visible_to_query_workers(demo_store, stack, tmp_path):
    import workers
    from workers.api import search
    from workers.cli.common import ingest_via_broker

    settings = demo_store.with_broker(stack.broker_url)
    workers.configure(settings)
    assert search("ZX_VISIBLE_1", mode="keyword", namespace="ingest-test").results == []
    path = _write(tmp_path / "one.jsonl", [{"id": "it-1", "namespace": "ingest-test",
                                            "content": "deploy blocked by ZX_VISIBLE_1 on web-9"}])
    (batch,) = list(ingest_via_broker(path, settings))
    assert batch["ok"] and batch["inserted"] == 1
    acked = time.perf_counter()
    while True:
        res = search("ZX_VISIBLE_1", mode="keyword", namespace="ingest-test")
        if res.results:
            break
        # a liveness bound (the delay is a figure, printed): each search process looks every store.poll_ms
        assert time.perf_counter() - acked < 10.0, "not visible within 10 s of the acknowledgement"
    delay = time.perf_counter() - acked
    assert [r.id for r in res.results] == ["it-1"]
    print(f"visibility delay after ingest ack: {delay * 1000:.0f} ms")


@pytest.mark.slow  # ~29 s; the default tier keeps the ingest tests above, the slow tier also streams 10,000
def test_queries_never_fail_while_the_ingest_worker_writes(demo_store, stack, tmp_path):
    import workers
    from workers.api import search
    from workers.cli.common import ingest_via_broker

    settings = demo_store.with_broker(stack.broker_url).replace(ingest_batch_size=100)
    workers.configure(settings)
    records = [{"id": f"load-{i}", "namespace": "ingest-load", "content": f"load test memory {i} token LT{i:04d}"}
               for i in range(500)]
    path = _write(tmp_path / "load.jsonl", records)
    failures: list[str] = []
    answered = 0
    stop = threading.Event()

    def stream() -> None:
        nonlocal answered
        while not stop.is_set():
            try:
                search("deploy window", namespace="code")
                answered += 1
            except Exception as exc:  # noqa: BLE001 - every failure counts
                failures.append(repr(exc))

    readers = [threading.Thread(target=stream) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        batches = list(ingest_via_broker(path, settings))
    finally:
        time.sleep(0.5)
        stop.set()
        for t in readers:
            t.join(60)
    assert all(b["ok"] for b in batches) and sum(b["inserted"] for b in batches) == 500
    assert failures == []
    assert answered > 0
    res = search("LT0499", mode="keyword", namespace="ingest-load")
    assert [r.id for r in res.results] == ["load-499"]
    everything = search("load test memory", mode="keyword", namespace="ingest-load", max_units=1000, top_k=1000)
    assert len(everything.results) == 500  # no acknowledged memory lost


@pytest.mark.slow
def test_load_60s_query_stream_while_ingesting_10k(demo_store, stack, tmp_path):
    """Two query threads through the workers for at least 60 s while the ingest
    worker adds 10,000 memories: zero failed queries, zero lost memories, and
    the delay from each batch's acknowledgement to its visibility."""
    import statistics

    import workers
    from workers.api import search
    from workers.cli.common import ingest_via_broker

    settings = demo_store.with_broker(stack.broker_url).replace(ingest_batch_size=500)
    workers.configure(settings)
    n = 10_000
    records = [{"id": f"bulk-{i}", "namespace": "bulk", "content": f"bulk memory {i} about topic {i % 97} token BK{i:05d}"}
               for i in range(n)]
    path = _write(tmp_path / "bulk.jsonl", records)
    failures: list[str] = []
    answered = 0
    stop = threading.Event()
    started = time.perf_counter()

    def stream() -> None:
        nonlocal answered
        while not stop.is_set() or time.perf_counter() - started < 60:
            try:
                search("deploy window", namespace="code", max_units=5)
                answered += 1
            except Exception as exc:  # noqa: BLE001
                failures.append(repr(exc))

    readers = [threading.Thread(target=stream) for _ in range(2)]
    for t in readers:
        t.start()
    delays = []
    try:
        for batch in ingest_via_broker(path, settings):
            assert batch["ok"], batch
            last = batch["first_line"] + batch["lines"] - 2  # 0-based index of the batch's last record
            acked = time.perf_counter()
            while not search(f"BK{last:05d}", mode="keyword", namespace="bulk").results:
                assert time.perf_counter() - acked < 10
            delays.append(time.perf_counter() - acked)
    finally:
        stop.set()
        for t in readers:
            t.join(120)
    elapsed = time.perf_counter() - started
    print(f"\nload: {answered} queries in {elapsed:.0f} s, {len(failures)} failed; "
          f"visibility delay after ack p50 {statistics.median(delays) * 1000:.0f} ms, max {max(delays) * 1000:.0f} ms")
    assert failures == []
    assert elapsed >= 60
    # the last batch seen by one search process: the other may look a poll later (store.poll_ms)
    deadline = time.perf_counter() + 10
    while len(search("bulk memory", mode="keyword", namespace="bulk", max_units=n, top_k=n).results) < n:
        assert time.perf_counter() < deadline, f"not all {n} memories found within 10 s of the last batch"  # the delays are figures (BENCHMARKS.md), bounded above only by the 10 s liveness check


def _cli(stack, settings, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
    env = stack.env({"DIMPLE_DATA_DIR": str(settings.data_dir), **(env or {})})
    return subprocess.run([sys.executable, "-m", "workers.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_no_ingest_worker_is_an_immediate_error_and_nothing_is_sent(demo_store, bare_broker, tmp_path):
    import workers
    from pipeline.errors import NoWorkerError
    from workers.cli.common import ingest_via_broker

    path = _write(tmp_path / "none.jsonl", [{"id": "nw-1", "namespace": "ingest-test", "content": "never sent"}])
    started = time.perf_counter()
    done = _cli(bare_broker, demo_store.settings, "ingest", str(path), "--via-broker", timeout=60)
    elapsed = time.perf_counter() - started
    print(f"\nno ingest worker: dimple ingest --via-broker exited {done.returncode} after {elapsed:.2f} s")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "no worker is consuming the 'ingest' queue" in done.stderr
    assert "dimple worker --queues ingest --concurrency 2" in done.stderr
    assert elapsed < 15  # generous: ~1 s of waiting for workers' answers plus the interpreter's start

    workers.configure(demo_store.with_broker(bare_broker.broker_url))
    with pytest.raises(NoWorkerError) as info:
        list(ingest_via_broker(path, demo_store.with_broker(bare_broker.broker_url)))
    assert info.value.queue == "ingest"
    assert redis.Redis.from_url(bare_broker.broker_url).llen("ingest") == 0  # nothing was sent


def test_dimple_ingest_via_broker_with_an_ingest_worker(demo_store, stack, tmp_path):
    path = _write(tmp_path / "cli.jsonl", [{"id": f"cli-{i}", "namespace": "ingest-cli", "content": f"cli {i}"}
                                           for i in range(3)])
    done = _cli(stack, demo_store.settings, "ingest", str(path), "--via-broker", env={"DIMPLE_INGEST_BATCH_SIZE": "2"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("lines 1-2: 2 new, 0 updated, 0 unchanged, store version ")
    assert done.stdout.splitlines()[1].startswith("lines 3-3: 1 new, 0 updated, 0 unchanged, store version ")


@pytest.mark.slow  # 2,000 memories embedded by the real model on the stack's worker: ~30 s
def test_a_batch_that_times_out_is_applied_later_and_nothing_after_it_is_sent(demo_store, stack, tmp_path):
    import workers
    from pipeline.errors import IngestTimeoutError
    from workers.api import search
    from workers.cli.common import ingest_via_broker

    # 2,000 memories to embed take seconds: far past the 0.05 s wait, and past the
    # ~1 s by which Celery's result wait can overshoot a timeout (400, as before
    # segments, now write in ~0.7 s and could be answered before get() gives up)
    settings = demo_store.with_broker(stack.broker_url).replace(ingest_batch_size=2000, ingest_batch_timeout_s=0.05)
    workers.configure(settings)
    path = _write(tmp_path / "slow.jsonl", [{"id": f"late-{i}", "namespace": "ingest-late",
                                            "content": f"late batch memory {i} ZX_LATE_{i}"} for i in range(2002)])
    with pytest.raises(IngestTimeoutError) as info:
        list(ingest_via_broker(path, settings))
    message = str(info.value)
    assert message.startswith("the batch of lines 1-2000 was sent but not acknowledged within 0.05 s")
    assert "stays in the ingest queue and is applied when an ingest worker runs it" in message
    assert "nothing after it was sent (lines 2001-2002)" in message

    deadline = time.monotonic() + 120
    while not search("ZX_LATE_1999", mode="keyword", namespace="ingest-late").results:
        assert time.monotonic() < deadline, "the timed-out batch was never applied"
        time.sleep(0.2)
    assert redis.Redis.from_url(stack.broker_url).llen("ingest") == 0
    for i in (2000, 2001):
        assert search(f"ZX_LATE_{i}", mode="keyword", namespace="ingest-late").results == []


def test_via_broker_a_link_to_a_later_batch_is_refused_before_anything_is_sent(demo_store, stack, tmp_path):
    """Was: the local check took any line of the file as a link's target, the
    worker refused the first batch (its target not written yet) and the
    second was written: one line of three in the store, exit 2."""
    path = _write(tmp_path / "ahead.jsonl", [
        {"id": "ahead-1", "namespace": "ingest-ahead", "content": "first", "supersedes": ["ahead-3"]},
        {"id": "ahead-2", "namespace": "ingest-ahead", "content": "second"},
        {"id": "ahead-3", "namespace": "ingest-ahead", "content": "third"}])
    done = _cli(stack, demo_store.settings, "ingest", str(path), "--via-broker", env={"DIMPLE_INGEST_BATCH_SIZE": "2"})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "line 1" in done.stderr and "supersedes" in done.stderr and "'ahead-3' is on line 3, in a later batch" in done.stderr
    assert done.stdout == ""  # no batch acknowledged: none sent
    assert redis.Redis.from_url(stack.broker_url).llen("ingest") == 0


def test_via_broker_nothing_after_a_batch_the_worker_rejects_is_sent(demo_store, stack, tmp_path):
    """The CLI's limits are looser than the workers' (a setting differs between
    hosts): the worker rejects the batch the CLI let through, nothing of it is
    written, and the batches after it are not sent."""
    path = _write(tmp_path / "limits.jsonl", [
        {"id": "lim-1", "namespace": "ingest-lim", "content": "fits"},
        {"id": "lim-2", "namespace": "ingest-lim", "content": "x" * 25_000},  # the workers' limit is 20,000
        {"id": "lim-3", "namespace": "ingest-lim", "content": "never sent"}])
    done = _cli(stack, demo_store.settings, "ingest", str(path), "--via-broker",
                env={"DIMPLE_INGEST_BATCH_SIZE": "1", "DIMPLE_LIMITS__MAX_CONTENT_CHARS": "100000"})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout.startswith("lines 1-1: 1 new") and "lines 3-3" not in done.stdout
    assert "lines 2-2: rejected" in done.stderr and "nothing after it was sent (line 3)" in done.stderr
