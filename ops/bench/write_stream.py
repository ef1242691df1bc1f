"""Writes beside a query stream, through real workers: one ``remember`` per
second for ``--seconds`` while two threads send hybrid queries continuously;
each written memory carries a unique token, and a third thread measures when
a keyword query through the workers first returns it.

    python -m ops.bench.write_stream --work /tmp/wstream --seconds 30

Reports failed queries, query latency p50/p99 with and without writes (the
same stream, first without writes), write acknowledgement p50/p99 and
visibility after acknowledgement p50/p99. The store is the demo corpus,
ingested with the real model; workers are started as ``ops.stack`` starts
them (redis on loopback, ingest with two processes).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

from ops.bench import emit

QUERIES = ["deploy window", "staging database host", "vegetarian restaurants", "ERR_CONN_RESET",
           "who owns the billing service", "rollback plan", "flaky test in CI", "weekend plans"]


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


def stream(search, stop: threading.Event, latencies: list[float], failures: list[str]) -> None:
    i = 0
    while not stop.is_set():
        t = time.perf_counter()
        try:
            search(QUERIES[i % len(QUERIES)], mode="hybrid")
            latencies.append(time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001 - every failure counts
            failures.append(repr(exc))
        i += 1


def run(work: Path, seconds: int) -> dict:
    import workers
    from ops.stack import Stack
    from pipeline.datasets.demo import write_demo
    from workers.api import remember, search
    from workers.app import app
    from workers.cli.common import ingest_file
    from workers.settings import WorkerSettings

    data = work / "data"
    settings = WorkerSettings(data_dir=data, _env_file=None)
    if not (data / "MANIFEST").exists():
        files = write_demo(data / "files")
        ingest_file(files["memories"], settings, progress=False)
    stack = Stack(work / "stack")
    stack.start_redis()
    env = {"DIMPLE_DATA_DIR": str(data)}
    try:
        stack.start_worker("b-embed", "embed", env=env)
        stack.start_worker("b-search", "search", concurrency=2, env=env)
        stack.start_worker("b-audit", "audit", env=env)
        stack.start_worker("b-ingest", "ingest", concurrency=2, env=env)
        workers.configure(settings.replace(broker_url=stack.broker_url))
        stack.wait_for_workers(app, ["b-embed", "b-search", "b-audit", "b-ingest"], timeout=180)
        remember({"namespace": "bench", "content": "warm-up write"})  # the ingest worker's first write
        for q in QUERIES:
            search(q)

        def phase(with_writes: bool) -> dict:
            stop = threading.Event()
            lat: list[float] = []
            fail: list[str] = []
            threads = [threading.Thread(target=stream, args=(search, stop, lat, fail)) for _ in range(2)]
            for t in threads:
                t.start()
            acks: list[float] = []
            visible: list[float] = []
            not_seen = 0
            start = time.perf_counter()
            n = 0
            while time.perf_counter() - start < seconds:
                tick = start + n
                time.sleep(max(0.0, tick - time.perf_counter()))
                if with_writes:
                    token = f"zqstream{n}x{int(time.time())}"
                    t0 = time.perf_counter()
                    remember({"namespace": "bench", "content": f"stream write {n} {token}"})
                    acked = time.perf_counter()
                    acks.append(acked - t0)
                    while True:
                        if search(token, mode="keyword", namespace="bench").results:
                            visible.append(time.perf_counter() - acked)
                            break
                        if time.perf_counter() - acked > 10:
                            not_seen += 1
                            break
                n += 1
            stop.set()
            for t in threads:
                t.join(60)
            return {"queries": len(lat), "failed_queries": len(fail), "query_p50_ms": _pct(lat, 0.5),
                    "query_p99_ms": _pct(lat, 0.99), "writes": len(acks), "ack_p50_ms": _pct(acks, 0.5),
                    "ack_p99_ms": _pct(acks, 0.99), "visible_after_ack_p50_ms": _pct(visible, 0.5),
                    "visible_after_ack_p99_ms": _pct(visible, 0.99), "not_visible_within_10s": not_seen,
                    "failures": fail[:5]}

        return {"load_before": os.getloadavg(), "without_writes": phase(False), "with_writes": phase(True),
                "load_after": os.getloadavg()}
    finally:
        workers.configure(settings)
        stack.stop_all()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-write-stream"))
    p.add_argument("--seconds", type=int, default=30)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    report = run(args.work, args.seconds)
    report["median_query_ratio"] = (
        round(report["with_writes"]["query_p50_ms"] / report["without_writes"]["query_p50_ms"], 3)
        if report["with_writes"]["query_p50_ms"] and report["without_writes"]["query_p50_ms"] else None)
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
