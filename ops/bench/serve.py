"""One query worker serving a large store: latency per mode and resident memory.

    python -m ops.bench.serve --store /tmp/dimple-synth-1m --queries 100

Runs the embedded pipeline (every stage a Celery task in eager mode, as a
query worker runs them) on ``--store`` (a folder with ``store.duckdb``) with
the hash embedder at the store's dimension (the real model's ~17 ms per query
and ~300 MB are the same at any store size), audit off. Prints the resident
set (VmRSS) and its peak (VmHWM) after opening, after loading the vector
index, and after the queries.
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
    args = parser.parse_args(argv)

    import workers
    from ops.bench import synth
    from pipeline.settings import Settings
    from pipeline.store import Store
    from workers import resources
    from workers.api import search

    logging.getLogger("dimple").setLevel(logging.WARNING)
    logging.getLogger("celery").setLevel(logging.WARNING)
    with Store.open(args.store / "store.duckdb", read_only=True) as st:
        dim = st.info.embedding_dim
        n = st.count()
    settings = Settings(_env_file=None).replace(
        data_dir=args.store, embedding_model=f"hash-{dim}", audit_enabled=False
    )
    workers.configure(settings)
    result = {"n": n, "start": memory()}
    t = time.perf_counter()
    resources.store()
    result["opened"] = memory()
    resources.index()
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
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    resources.close_store()
    return 0


if __name__ == "__main__":
    sys.exit(main())
