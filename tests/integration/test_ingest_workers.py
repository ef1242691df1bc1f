"""The DuckDB process model with real processes: query workers keep reading
while the ingest worker writes, and what it acknowledges becomes visible to
them without a restart."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytestmark = pytest.mark.integration


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_ingest_via_broker_is_visible_to_query_workers(demo_store, stack, tmp_path):
    import workers
    from workers.api import search
    from workers.cli import ingest_via_broker

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
        assert time.perf_counter() - acked < 2.0, "not visible within 2 s of the acknowledgement"
    delay = time.perf_counter() - acked
    assert [r.id for r in res.results] == ["it-1"]
    print(f"visibility delay after ingest ack: {delay * 1000:.0f} ms")


def test_queries_never_fail_while_the_ingest_worker_writes(demo_store, stack, tmp_path):
    import workers
    from workers.api import search
    from workers.cli import ingest_via_broker

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
    from workers.cli import ingest_via_broker

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
    everything = search("bulk memory", mode="keyword", namespace="bulk", max_units=n, top_k=n)
    assert len(everything.results) == n
    assert max(delays) <= 2.0
