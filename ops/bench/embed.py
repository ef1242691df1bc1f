"""The query embedder: numpy MiniLM (``pipeline.minilm``) against
sentence-transformers, the baseline, on the same packaged model, in one run.

    python -m ops.bench.embed --rounds 5 --queries 200 --batch 64

Three figures per side, the sides alternated round by round so drift hits
both alike: a cold process embedding one query (imports, model load, one
encode: what a cold ``dimple search`` pays), the warm per-query latency
(single queries), and warm throughput on batches of ``--batch`` queries (what
``search_many`` and ``dimple eval`` pay). Both sides use the same BLAS and
thread count (numpy's and torch's defaults on this machine, printed). The
baseline runs as its authors recommend: ``SentenceTransformer.encode`` with
``convert_to_numpy`` and ``normalize_embeddings``.

    python -m ops.bench.embed --blas --rounds 2 --queries 300

``--blas`` compares instead the numpy embedder on one BLAS thread (what a
worker process uses, ``DIMPLE_WORKER_BLAS_THREADS``) against numpy's default
(one per core), the baseline: single queries and batches, with every other
core idle, then with one core held by a spinning process (a host whose other
worker processes are busy). The sides alternate round by round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

COLD = {
    "numpy": "from pipeline.minilm import MiniLMEmbedder; MiniLMEmbedder().embed(['where do we deploy on fridays'])",
    "sentence-transformers": (
        "from pipeline.embedders import SentenceTransformerEmbedder; "
        "SentenceTransformerEmbedder().embed(['where do we deploy on fridays'])"
    ),
}


def _queries(n: int) -> list[str]:
    from pipeline.datasets.demo import generate_corpus, generate_queries

    texts = [q["text"] for q in generate_queries(generate_corpus(7), 7)[0]]
    return [texts[i % len(texts)] for i in range(n)]


def _cold(side: str) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", COLD[side]], check=True, env=env, capture_output=True)
    return time.perf_counter() - t0


def blas(rounds: int, n_queries: int, batch_size: int) -> dict:
    """``--blas``: one BLAS thread against the default, other cores idle and one busy."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from pipeline.minilm import MiniLMEmbedder

    emb = MiniLMEmbedder()
    texts = _queries(max(n_queries, batch_size * 4))
    default = max(lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas")
    sides = {"one thread": 1, f"default ({default} threads)": default}
    out: dict = {"load_average_before": os.getloadavg()}
    for other in ("idle", "busy"):
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if other == "busy" else None
        try:
            single: dict[str, list[float]] = {s: [] for s in sides}
            batch: dict[str, list[float]] = {s: [] for s in sides}
            for r in range(rounds):
                for side in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                    with threadpool_limits(limits=sides[side], user_api="blas"):
                        emb.embed(texts[:8])  # warm: the threads started
                        for text in texts[:n_queries]:
                            t0 = time.perf_counter()
                            emb.embed([text])
                            single[side].append((time.perf_counter() - t0) * 1000)
                        t0 = time.perf_counter()
                        for i in range(0, batch_size * 4, batch_size):
                            emb.embed(texts[i:i + batch_size])
                        batch[side].append(batch_size * 4 / (time.perf_counter() - t0))
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
        out[other] = {side: {**{f"single_p{q}_ms": round(float(np.percentile(single[side], q)), 2) for q in (50, 95)},
                             "batch_queries_per_s": round(float(np.median(batch[side])), 1)} for side in sides}
        one, base = out[other]["one thread"], out[other][list(sides)[1]]
        out[other]["ratios_one_over_default"] = {
            "single_p50_time": round(one["single_p50_ms"] / base["single_p50_ms"], 3),
            "single_p95_time": round(one["single_p95_ms"] / base["single_p95_ms"], 3),
            "batch_throughput": round(one["batch_queries_per_s"] / base["batch_queries_per_s"], 3)}
    out["load_average_after"] = os.getloadavg()
    return out


def main(argv=None) -> int:
    from pipeline.embedders import SentenceTransformerEmbedder
    from pipeline.minilm import MiniLMEmbedder

    p = argparse.ArgumentParser(prog="python -m ops.bench.embed")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--queries", type=int, default=200, help="single queries per side and round")
    p.add_argument("--batch", type=int, default=64, help="queries per batch for the throughput figure")
    p.add_argument("--json", action="store_true")
    p.add_argument("--blas", action="store_true", help="one BLAS thread against the default (numpy side only)")
    args = p.parse_args(argv)
    if args.blas:
        print(json.dumps(blas(args.rounds, args.queries, args.batch), indent=2))
        return 0

    import torch

    sides = {"numpy": MiniLMEmbedder(), "sentence-transformers": SentenceTransformerEmbedder()}
    texts = _queries(max(args.queries, args.batch * 4))
    for emb in sides.values():  # warm-up
        emb.embed(texts[:8])
    cold: dict[str, list[float]] = {s: [] for s in sides}
    single: dict[str, list[float]] = {s: [] for s in sides}
    batch: dict[str, list[float]] = {s: [] for s in sides}
    diff = float(np.abs(sides["numpy"].embed(texts[:64]) - sides["sentence-transformers"].embed(texts[:64])).max())
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for side in order:
            cold[side].append(_cold(side))
            emb = sides[side]
            for text in texts[: args.queries]:
                t0 = time.perf_counter()
                emb.embed([text])
                single[side].append((time.perf_counter() - t0) * 1000)
            chunks = [texts[i : i + args.batch] for i in range(0, args.batch * 4, args.batch)]
            t0 = time.perf_counter()
            for chunk in chunks:
                emb.embed(chunk)
            batch[side].append(args.batch * len(chunks) / (time.perf_counter() - t0))
    out = {
        "load_average": os.getloadavg(),
        "torch_threads": torch.get_num_threads(),
        "max_abs_difference": diff,
        "cold_s_median": {s: round(float(np.median(v)), 3) for s, v in cold.items()},
        "single_ms_p50": {s: round(float(np.median(v)), 2) for s, v in single.items()},
        "batch_queries_per_s_median": {s: round(float(np.median(v)), 1) for s, v in batch.items()},
    }
    base, ours = "sentence-transformers", "numpy"
    out["ratios_numpy_over_baseline"] = {
        "cold_time": round(out["cold_s_median"][ours] / out["cold_s_median"][base], 3),
        "single_p50_time": round(out["single_ms_p50"][ours] / out["single_ms_p50"][base], 3),
        "batch_throughput": round(out["batch_queries_per_s_median"][ours] / out["batch_queries_per_s_median"][base], 3),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
