"""``dimple tune``'s evaluation: each query's legs once and every configuration
re-fused (``pipeline.evaluation.tune.fused_runs``) against running every
configuration as searches (``search_many``), and what the store's tuned
settings cost a query (``workers.resources.Resources.settings``).

    python -m ops.bench.tune

A generated store (hash-64 embedder, 5,000 memories of 20 words from 3,000,
seed 0) in a temporary folder, embedded, 200 queries of 4 words each drawn
from one memory; the grid of ``dimple tune`` (11 configurations, and the
current settings' convex alpha 0.45 beside them), 100 results each. The hash embedder makes the
vector leg cheap, so the re-fusion's gain is the smallest it can be here: a
real model's leg costs more per query, and is still paid once.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

import workers
from pipeline import evaluation as ev
from pipeline.evaluation.tune import GRID, current_config, fused_runs
from pipeline.store.tuned import TunedFusion, write_tuned
from pipeline.store.vector import compile_kernels
from workers import api, resources
from workers.cli.common import ingest_file
from workers.settings import WorkerSettings


def main() -> None:
    rng = random.Random(0)
    words = [f"w{i}" for i in range(3000)]
    tmp = Path(tempfile.mkdtemp(prefix="dimple-bench-tune-"))
    s = WorkerSettings(data_dir=tmp / "data", embedding_model="hash-64", _env_file=None, audit_enabled=False)
    workers.configure(s)
    recs = [{"id": f"m{i}", "namespace": "n", "content": " ".join(rng.choice(words) for _ in range(20))}
            for i in range(5000)]
    (tmp / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    ingest_file(tmp / "m.jsonl", s, progress=False)
    queries = [ev.QuerySpec(f"q{i}", " ".join(rng.choice(recs[i]["content"].split()) for _ in range(4)))
               for i in range(200)]
    compile_kernels()
    res = resources.current()
    api.search(queries[0].text)  # store, index, embedder loaded before the clocks
    eff = res.settings()
    configs = [current_config(eff), *(c for c in GRID if c != current_config(eff))]
    t0 = time.perf_counter()
    fused_runs(ev.QuerySet("bench", queries, {}), eff, res, res.snapshot(), configs, defaults={"max_units": 100})
    once = time.perf_counter() - t0
    t0 = time.perf_counter()
    for c in configs:
        workers.configure(c.apply(s))
        api.search_many([{"query": q.text, "max_units": 100} for q in queries])
    searches = time.perf_counter() - t0
    print(f"{len(queries)} queries x {len(configs)} configurations: legs once, re-fused {once:.1f} s; "
          f"every configuration as searches {searches:.1f} s ({once / searches:.2f}x)")

    workers.configure(s)
    n = 200_000
    for label in ("no tuned file", "tuned file"):
        if label == "tuned file":
            write_tuned(s, TunedFusion(fusion="convex", convex_alpha=0.3))
            workers.configure(s)
        t0 = time.perf_counter()
        for _ in range(n):
            res.settings()
        print(f"settings(), {label}: {(time.perf_counter() - t0) / n * 1e6:.2f} us a call")
    path = s.data_dir / "TUNED.json"
    t0 = time.perf_counter()
    for _ in range(n):
        path.stat()
    print(f"one stat of the tuned file (what an unthrottled call would add): {(time.perf_counter() - t0) / n * 1e6:.2f} us")


if __name__ == "__main__":
    main()
