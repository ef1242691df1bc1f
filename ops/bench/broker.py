"""Through Redis and real workers against embedded, in one run.

    python -m ops.bench.broker --n 100 --batch 600
    python -m ops.bench.broker --n 0 --batch 0 --eval 450 --rounds 3   # dimple eval's runner only

Single-query latency (sequential ``search``, with Redis commands and bytes
per query through the broker) and batch throughput
(``search_many``) on the demo store, embedded in this process and through a
redis-server plus an embed worker, a search worker (2 processes) and an
audit worker started here (ops.stack). Goals (issue 5): single-query p50 at
most embedded + 60 ms; batch throughput at least 80% of embedded.

``--eval N`` also times ``dimple eval``'s runner (``pipeline.evaluation.run_queries``
with a progress callback, ``max_units`` 100) over the demo's judged queries
repeated to N, per side, and checks that both sides score the same (issue 6:
eval through the broker at least 80% of embedded queries/s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import redis

from ops.bench import embedded_demo
from pipeline.contracts import Origin


def _latency(search, queries, n):
    out = []
    for i in range(n):
        q = queries[i % len(queries)]
        t0 = time.perf_counter()
        search(q["text"], namespace=q.get("namespace"), origin="eval")  # benchmark traffic: never replayed
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _redis_per_query(rcon, n: int) -> dict:
    """Redis commands and network bytes per query since the last CONFIG RESETSTAT
    (noise-free, unlike latency; includes the workers' idle polling, ~1 command
    per query)."""
    calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in rcon.info("commandstats").items()}
    calls.pop("config|resetstat", None)
    stats = rcon.info("stats")
    return {
        "redis_commands_per_query": round(sum(calls.values()) / n, 1),
        "redis_bytes_per_query": round((stats["total_net_input_bytes"] + stats["total_net_output_bytes"]) / n),
    }


def _throughput(search_many, queries, n, batch):
    asks = [{"query": queries[i % len(queries)]["text"], "namespace": queries[i % len(queries)].get("namespace"),
             "origin": "eval"} for i in range(n)]
    t0 = time.perf_counter()
    res = search_many(asks, batch_size=batch)
    secs = time.perf_counter() - t0
    assert len(res) == n
    return n / secs


def _eval(search_many, queries, qrels, n, batch, in_flight=8):
    """dimple eval's runner over the judged set repeated to ``n``: (queries/s, figures of the first pass)."""
    from pipeline import evaluation as ev

    specs = [ev.QuerySpec(f"{queries[i % len(queries)]['id']}#{i}", queries[i % len(queries)]["text"],
                          {"namespace": queries[i % len(queries)].get("namespace")}) for i in range(n)]
    done = []
    runs, secs = ev.run_queries(search_many, specs, defaults={"max_units": 100}, batch_size=batch,
                                in_flight=in_flight, progress=done.append, origin=Origin.eval)
    assert sum(done) == n and all(r.error is None for r in runs)
    first = {r.id.split("#")[0]: r.ranked for r in runs[: len(queries)]}
    return n / secs, ev.score(first, qrels)[0]


def main(argv=None) -> int:
    import workers
    from ops.stack import Stack
    from workers.api import search, search_many
    from workers.app import app

    p = argparse.ArgumentParser(prog="python -m ops.bench.broker")
    p.add_argument("--n", type=int, default=100, help="sequential single queries per side")
    p.add_argument("--batch", type=int, default=600, help="queries in the search_many run per side")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--eval", type=int, default=0, help="queries in the dimple eval runner's run per side (0: skip)")
    p.add_argument("--in-flight", type=int, default=8, help="dimple eval's --in-flight")
    p.add_argument("--rounds", type=int, default=1, help="broker/embedded alternations (each broker side is "
                   "compared with the embedded sides around it)")
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-broker-bench"))
    args = p.parse_args(argv)
    embedded, queries = embedded_demo(args.work)
    from workers.cli.demo import build_demo_store, load_queries

    _, qrels = load_queries(build_demo_store(embedded))
    _latency(search, queries, 20)  # warm-up

    stack = Stack(args.work / "stack")
    stack.start_redis()
    env = {"DIMPLE_DATA_DIR": str(embedded.data_dir)}
    try:
        broker = embedded.replace(broker_url=stack.broker_url)
        workers.configure(broker)  # the pings go through it
        stack.start_query_workers(app, "b", env, audit=True)
        rcon = redis.Redis.from_url(stack.broker_url)
        _latency(search, queries, 20)  # warm-up of the workers' model, store and index

        out, figures = {}, {}
        sides = [("embedded", embedded), ("broker", broker), ("embedded_again", embedded)]
        for r in range(2, args.rounds + 1):  # more alternations: a shared machine's noise shows in the spread
            sides += [(f"broker_{r}", broker), (f"embedded_{r}", embedded)]
        for side, settings in sides:
            workers.configure(settings)
            out[side] = {}
            if args.n:
                if settings is broker:
                    time.sleep(0.5)  # the previous side's audit rows are written
                    rcon.config_resetstat()
                lat = np.asarray(_latency(search, queries, args.n))
                out[side].update(p50_ms=round(float(np.median(lat)), 1), p95_ms=round(float(np.percentile(lat, 95)), 1))
                if settings is broker:
                    time.sleep(0.3)  # this side's last audit row
                    out[side].update(_redis_per_query(rcon, args.n))
            if args.batch:
                out[side]["batch_qps"] = round(_throughput(search_many, queries, args.batch, args.batch_size), 1)
            if args.eval:
                qps, figures[side] = _eval(search_many, queries, qrels, args.eval, args.batch_size, args.in_flight)
                out[side]["eval_qps"] = round(qps, 1)
        emb = {k: (out["embedded"][k] + out["embedded_again"][k]) / 2 for k in out["embedded"]}
        if args.n:
            out["single_p50_extra_ms"] = round(out["broker"]["p50_ms"] - emb["p50_ms"], 1)
        if args.batch:
            out["batch_throughput_ratio"] = round(out["broker"]["batch_qps"] / emb["batch_qps"], 3)
        if args.eval:
            out["eval_throughput_ratio"] = round(out["broker"]["eval_qps"] / emb["eval_qps"], 3)
            if args.rounds > 1:
                # each broker side against the mean of the embedded sides on either side of it
                names = [name for name, _ in sides]
                ratios = [out[b]["eval_qps"] / ((out[names[i - 1]]["eval_qps"] + out[names[i + 1]]["eval_qps"]) / 2)
                          for i, b in enumerate(names) if b.startswith("broker")]
                out["eval_throughput_ratios"] = [round(x, 3) for x in ratios]
                out["eval_throughput_ratio_median"] = round(float(np.median(ratios)), 3)
                out["eval_qps_median"] = {
                    "embedded": round(float(np.median([out[n]["eval_qps"] for n in names if n.startswith("embedded")])), 1),
                    "broker": round(float(np.median([out[n]["eval_qps"] for n in names if n.startswith("broker")])), 1)}
            out["eval_figures_equal"] = all(f == figures["embedded"] for f in figures.values())
            out["eval_ndcg@10"] = round(figures["broker"]["ndcg@10"], 4)
        print(json.dumps(out, indent=2))
    finally:
        workers.configure(embedded)
        stack.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
