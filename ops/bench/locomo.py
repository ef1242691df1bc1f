"""LoCoMo retrieval benchmark: quality per mode, descent recall against exact
search, and ingest throughput against raw embedding, all in one run.

    python -m ops.bench.locomo --data ../shared/data/locomo/locomo10.json --work /tmp/dimple-locomo

Protocol (../shared/data/locomo/README.md): each question is searched in its
own conversation's namespace; relevant = its evidence turns.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.contracts import Scope
from pipeline.datasets.locomo import load_locomo
from pipeline.evaluation.metrics import score
from pipeline.settings import Settings
from pipeline.store.database import Store
from pipeline.store.vector import VectorIndex, descend, exact
from workers.settings import WorkerSettings


def build(settings: Settings, data: Path, reuse: bool) -> dict:
    """Ingest LoCoMo into a fresh store, timing it against raw embedding."""
    from ops.bench.ingest import measure
    from workers.cli.common import store_exists

    if reuse and store_exists(settings):
        return {}
    return {"ingest": measure(settings, load_locomo(data).records)}


def quality(settings: Settings, data: Path, limit: int | None) -> dict:
    import workers
    from workers.api import search_many

    workers.configure(settings)
    loco = load_locomo(data)
    queries = loco.queries[:limit] if limit else loco.queries
    qrels = {q["id"]: loco.qrels[q["id"]] for q in queries}
    out = {}
    for mode in ("keyword", "semantic", "hybrid"):
        asks = [{"query": q["text"], "namespace": q["namespace"], "mode": mode, "max_units": 50} for q in queries]
        t0 = time.perf_counter()
        res = search_many(asks)
        secs = time.perf_counter() - t0
        run = {q["id"]: [r.id for r in rs.results] for q, rs in zip(queries, res)}
        figures = score(run, qrels, ("ndcg@10", "recall@5", "recall@10", "recall@50", "mrr@10"))[0]
        figures["queries_per_s"] = len(queries) / secs
        out[mode] = {k: round(v, 4) for k, v in figures.items()}
        print(mode, out[mode], file=sys.stderr, flush=True)
    return out


def descent_recall(settings: Settings, data: Path, limit: int | None) -> dict:
    from workers import resources

    loco = load_locomo(data)
    queries = loco.queries[:limit] if limit else loco.queries
    embedder = resources.current().embedder()
    from workers.cli.common import require_store

    with Store.open(require_store(settings), read_only=True) as store:
        index = VectorIndex.load(store.con, store.generation, store.info.embedding_dim)
    vectors = embedder.embed([q["text"] for q in queries])
    recalls, scored, t_desc, t_exact = [], [], [], []
    tree = settings.tree
    for q, vec in zip(queries, vectors):
        scope = Scope(namespace=q["namespace"])
        t0 = time.perf_counter()
        hits, profile = descend(index, vec, index.start_topics(scope), beam_width=tree.beam_width,
                                max_depth=tree.max_depth, top_k=10)
        t_desc.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ref = exact(index, vec, scope, 10)
        t_exact.append(time.perf_counter() - t0)
        recalls.append(len({h for h, _ in hits} & {h for h, _ in ref}) / max(len(ref), 1))
        scored.append(profile["memories_scored"])
    return {
        "queries": len(queries),
        "recall@10_vs_exact": round(float(np.mean(recalls)), 4),
        "memories_scored_mean": round(float(np.mean(scored)), 1),
        "memories_scored_max": int(np.max(scored)),
        "bound_beam_x_leaf": tree.beam_width * tree.max_leaf_items,
        "namespace_size_mean": round(index.size / max(len(index.namespaces), 1), 1),
        "descent_p50_ms": round(float(np.median(t_desc)) * 1000, 3),
        "exact_p50_ms": round(float(np.median(t_exact)) * 1000, 3),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.locomo")
    p.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[3] / "shared/data/locomo/locomo10.json")
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-locomo"))
    p.add_argument("--reuse", action="store_true", help="keep an existing store (skips the ingest benchmark)")
    p.add_argument("--limit", type=int, help="first N questions only")
    p.add_argument("--out", type=Path, help="write the JSON report here")
    args = p.parse_args(argv)
    if not args.data.is_file():
        print(f"LoCoMo not found at {args.data}", file=sys.stderr)
        return 2
    settings = WorkerSettings().replace(data_dir=args.work)
    report = {"settings": {"tree": settings.tree.model_dump(), "rrf_k": settings.rrf_k,
                           "weights": [settings.vector_weight, settings.fts_weight]}}
    report.update(build(settings, args.data, args.reuse))
    report["descent"] = descent_recall(settings, args.data, args.limit)
    report["quality"] = quality(settings, args.data, args.limit)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
