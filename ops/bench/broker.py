"""Through Redis and real workers against embedded, in one run.

    python -m ops.bench.broker --n 100 --batch 600

Single-query latency (sequential ``search``) and batch throughput
(``search_many``) on the demo store, embedded in this process and through a
redis-server plus an embed worker, a search worker (2 processes) and an
audit worker started here (ops.stack). Goals (issue 5): single-query p50 at
most embedded + 60 ms; batch throughput at least 80% of embedded.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from ops.bench import embedded_demo


def _latency(search, queries, n):
    out = []
    for i in range(n):
        q = queries[i % len(queries)]
        t0 = time.perf_counter()
        search(q["text"], namespace=q.get("namespace"))
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _throughput(search_many, queries, n, batch):
    asks = [{"query": queries[i % len(queries)]["text"], "namespace": queries[i % len(queries)].get("namespace")}
            for i in range(n)]
    t0 = time.perf_counter()
    res = search_many(asks, batch_size=batch)
    secs = time.perf_counter() - t0
    assert len(res) == n
    return n / secs


def main(argv=None) -> int:
    import workers
    from ops.stack import Stack
    from workers.api import search, search_many
    from workers.app import app

    p = argparse.ArgumentParser(prog="python -m ops.bench.broker")
    p.add_argument("--n", type=int, default=100, help="sequential single queries per side")
    p.add_argument("--batch", type=int, default=600, help="queries in the search_many run per side")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-broker-bench"))
    args = p.parse_args(argv)
    embedded, queries = embedded_demo(args.work)
    _latency(search, queries, 20)  # warm-up

    stack = Stack(args.work / "stack")
    stack.start_redis()
    env = {"DIMPLE_DATA_DIR": str(embedded.data_dir)}
    try:
        stack.start_worker("b-embed", "embed", env=env)
        stack.start_worker("b-search", "search", concurrency=2, env=env)
        stack.start_worker("b-audit", "audit", env=env)
        broker = embedded.replace(broker_url=stack.broker_url)
        workers.configure(broker)
        stack.wait_for_workers(app, ["b-embed", "b-search", "b-audit"], timeout=120)
        _latency(search, queries, 20)  # warm-up of the workers' model, store and index

        out = {}
        for side, settings in (("embedded", embedded), ("broker", broker), ("embedded_again", embedded)):
            workers.configure(settings)
            lat = np.asarray(_latency(search, queries, args.n))
            qps = _throughput(search_many, queries, args.batch, args.batch_size)
            out[side] = {"p50_ms": round(float(np.median(lat)), 1), "p95_ms": round(float(np.percentile(lat, 95)), 1),
                         "batch_qps": round(qps, 1)}
        emb = {k: (out["embedded"][k] + out["embedded_again"][k]) / 2 for k in ("p50_ms", "batch_qps")}
        out["single_p50_extra_ms"] = round(out["broker"]["p50_ms"] - emb["p50_ms"], 1)
        out["batch_throughput_ratio"] = round(out["broker"]["batch_qps"] / emb["batch_qps"], 3)
        print(json.dumps(out, indent=2))
    finally:
        workers.configure(embedded)
        stack.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
