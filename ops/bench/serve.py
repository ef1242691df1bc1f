"""One query worker serving a large store: latency per mode and resident memory.

    python -m ops.bench.serve --store /tmp/dimple-synth-1m --queries 100

Runs the embedded pipeline (every stage a Celery task in eager mode, as a
query worker runs them) on ``--store`` (a folder with ``store.duckdb``) with
the hash embedder at the store's dimension (the real model's ~17 ms per query
and ~300 MB are the same at any store size), audit off. Prints the resident
set (VmRSS) and its peak (VmHWM) after opening, after loading the vector
index, and after the queries.

``--broker`` then compares the end-to-end hybrid query embedded against
through Redis (a redis-server, an embed worker and a search worker with 2
processes started here on loopback, each process holding its own index):
single-query p50/p95 and ``search_many`` throughput (``--batch`` queries,
64 per canvas), embedded measured before and after the broker side.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np


def memory() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = round(int(line.split()[1]) / 1024, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--broker", action="store_true", help="also hybrid end to end through Redis and 2 search processes")
    parser.add_argument("--batch", type=int, default=200, help="queries in each search_many run (--broker)")
    args = parser.parse_args(argv)

    import workers
    from ops.bench import synth
    from pipeline.store.database import Store
    from workers import resources
    from workers.api import search
    from workers.settings import WorkerSettings

    logging.getLogger("dimple").setLevel(logging.WARNING)
    logging.getLogger("celery").setLevel(logging.WARNING)
    with Store.open(args.store / "store.duckdb", read_only=True) as st:
        dim = st.info.embedding_dim
        n = st.count()
    settings = WorkerSettings(_env_file=None).replace(
        data_dir=args.store, embedding_model=f"hash-{dim}", audit_enabled=False
    )
    workers.configure(settings)
    result = {"n": n, "start": memory()}
    t = time.perf_counter()
    resources.current().store()
    result["opened"] = memory()
    resources.current().index()
    result["index_load_s"] = round(time.perf_counter() - t, 1)
    result["index_loaded"] = memory()
    print(f"{n} memories; store open {result['opened']}, index loaded in {result['index_load_s']}s {result['index_loaded']}")
    queries = synth.queries(args.queries, seed=3)
    for mode in ("keyword", "semantic", "hybrid"):
        lat = []
        for q in queries:
            t0 = time.perf_counter()
            search(q, mode=mode)
            lat.append(time.perf_counter() - t0)
        result[mode] = {"p50_ms": round(float(np.percentile(lat, 50)) * 1000, 1),
                        "p95_ms": round(float(np.percentile(lat, 95)) * 1000, 1)}
        print(f"  {mode}: p50 {result[mode]['p50_ms']} ms, p95 {result[mode]['p95_ms']} ms; {memory()}")
    result["after"] = memory()
    print(f"after {3 * args.queries} queries: {result['after']}")
    if args.broker:
        result["broker"] = _through_broker(settings, queries, args.batch)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    resources.current().close_store()
    return 0


def _through_broker(settings, queries: list[str], batch: int) -> dict:
    import workers
    from ops.bench import synth
    from ops.stack import Stack
    from workers.api import search, search_many
    from workers.app import app

    def single(n: int = len(queries)) -> dict:
        lat = []
        for q in queries[:n]:
            t0 = time.perf_counter()
            search(q, mode="hybrid")
            lat.append(time.perf_counter() - t0)
        return {"p50_ms": round(float(np.percentile(lat, 50)) * 1000, 1),
                "p95_ms": round(float(np.percentile(lat, 95)) * 1000, 1)}

    many = [{"query": q, "mode": "hybrid"} for q in synth.queries(batch, seed=4)]

    def throughput() -> float:
        t0 = time.perf_counter()
        results = search_many(many, batch_size=64)
        assert len(results) == len(many)
        return round(len(many) / (time.perf_counter() - t0), 1)

    out = {"embedded": {**single(), "batch_qps": throughput()}}
    stack = Stack(Path(settings.data_dir).parent / f"serve-stack-{Path(settings.data_dir).name}")
    stack.start_redis()
    env = {"DIMPLE_DATA_DIR": str(settings.data_dir), "DIMPLE_EMBEDDING_MODEL": settings.embedding_model,
           "DIMPLE_AUDIT_ENABLED": "false"}
    try:
        workers.configure(settings.replace(broker_url=stack.broker_url))  # the pings go through it
        stack.start_query_workers(app, "s", env)
        t0 = time.perf_counter()
        search_many(many[:4], batch_size=1)  # both search processes load their index
        out["workers_warm_s"] = round(time.perf_counter() - t0, 1)
        out["broker"] = {**single(), "batch_qps": throughput()}
    finally:
        workers.configure(settings)
        stack.stop_all()
    out["embedded_again"] = {**single(), "batch_qps": throughput()}
    emb_p50 = (out["embedded"]["p50_ms"] + out["embedded_again"]["p50_ms"]) / 2
    emb_qps = (out["embedded"]["batch_qps"] + out["embedded_again"]["batch_qps"]) / 2
    out["single_p50_extra_ms"] = round(out["broker"]["p50_ms"] - emb_p50, 1)
    out["batch_throughput_ratio"] = round(out["broker"]["batch_qps"] / emb_qps, 3)
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    sys.exit(main())
