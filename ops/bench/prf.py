"""Pseudo-relevance feedback, measured leaving one set out (issue 31): does a
second pass, expanded from each leg's own first hits, earn a place in the
default?

    # the default caches of ``ops.bench.fusion cache`` (BENCHMARKS.md, "Fusion defaults chosen leave one
    # set out"), their stores under --data-dir/<set>; then both experiments, numpy over the stores
    python -m ops.bench.prf --caches /tmp/fusion/cache --data-dir /tmp/fusion/data --md F
    # (the sets from --beir-root, default ../shared/data/beir, and --locomo)

- **RM3 on the full-text leg** (Lavrenko & Croft 2001; Anserini's RM3 with
  BM25): the query's terms at weight ``lam`` / |q| beside the ``terms`` most
  likely terms of the relevance model of its ``docs`` best memories (each
  memory's term frequencies over its length, weighted by its BM25 share; ``idf``:
  terms ranked by that likelihood times their IDF), each term's BM25 weighted
  so, over the store's own postings (``pipeline.store.fulltext``: the index's
  terms, its statistics, the namespace scope).
- **Rocchio on the vector leg** (the query embedding plus ``beta`` times the
  mean of its ``k`` nearest, normalised; Li et al. 2021, "Pseudo relevance
  feedback with deep language models and dense retrievers"), by exact search
  over the store's vectors. Its baseline is exact search too (the engine's
  beam reaches 0.85-1.0 of exact search's top 10 on these sets).

Each variant's lists replace that leg's in the cached queries; convex fusion at
every alpha (``ops.bench.fusion``) then chooses, leaving one set out, among the
default's candidates alone and with every variant's (``ops.bench.fusion_bm25.joint``).
A variant earns its place only if the mean nDCG@10 on the sets left out rises.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ops.bench.fusion import evaluate, leave_one_out
from ops.bench.fusion_bm25 import joint
from pipeline.store.fulltext.bm25 import bm25

RM3 = [(d, t, lam, by_idf) for d in (5, 10) for t in (10, 20) for lam in (0.5, 0.7) for by_idf in (False, True)]
ROCCHIO = [(k, beta) for k in (3, 5, 10) for beta in (0.3, 0.7, 1.5)]
NOW = "default"


def _open(name: str, data_dir: Path, src: Path) -> tuple[Any, dict, Any, Any]:
    """(run settings, query spec by id, full-text postings, vector index) of the set's store, as
    ``ops.bench.fusion cache`` opened it."""
    import workers
    from workers import resources
    from workers.cli.eval import load_source
    from workers.settings import WorkerSettings

    os.environ["DIMPLE_DATA_DIR"] = str(data_dir / name)
    source = argparse.Namespace(queries=None, qrels=None, demo=False, store=None, strict=False,
                                beir=src if name != "locomo" else None, locomo=src if name == "locomo" else None)
    qset, run_settings = load_source(source, WorkerSettings())
    workers.configure(run_settings)
    with resources.current().view() as v:
        postings, index = (v.postings(), v.index()) if v is not None else (None, None)
    if postings is None or index is None:
        raise SystemExit(f"{name}: no store with both indexes under {data_dir / name}")
    return run_settings, {q.id: q for q in qset.queries}, postings, index


class _Fulltext:
    """The base's postings, with each memory's terms (the postings inverted) for feedback."""

    def __init__(self, postings, k1: float, b: float):
        self.p, self.k1, self.b = postings, k1, b
        self.avgdl = postings.total_len / postings.num_docs
        self.term_of = np.repeat(np.arange(len(postings.df)), np.diff(postings.start))

    def idf(self, tid: int) -> float:
        df = int(self.p.df[tid])
        return math.log10(((self.p.num_docs - df) + 0.5) / (df + 0.5) + 1)

    def search(self, weights: dict[int, float], ns_code: int | None, limit: int = 100) -> list[tuple[int, float]]:
        scores = np.zeros(self.p.num_docs)
        hit = np.zeros(self.p.num_docs, dtype=bool)
        for tid, w in weights.items():
            docs, tf = self.p.postings(tid)
            scores[docs] += w * bm25(tf, self.p.lens[docs], int(self.p.df[tid]), self.p.num_docs, self.avgdl,
                                     self.k1, self.b)
            hit[docs] = True
        if ns_code is not None:
            hit &= self.p.ns == ns_code
        cand = np.flatnonzero(hit)
        order = cand[np.lexsort((cand, -scores[cand]))][:limit]
        return [(int(d), float(scores[d])) for d in order]

    def rm3(self, query: list[int], first: list[tuple[int, float]], docs: int, terms: int, lam: float,
            by_idf: bool) -> dict[int, float]:
        top = first[:docs]
        total = sum(s for _, s in top)
        model: Counter[int] = Counter()
        if total > 0:
            at = np.isin(self.p.docid, [d for d, _ in top])
            for d, s in top:
                mine = at & (self.p.docid == d)
                tids, tf = self.term_of[mine], self.p.tf[mine]
                for tid, c in zip(tids.tolist(), (tf / tf.sum()).tolist(), strict=True):
                    model[tid] += s / total * c
        chosen = sorted(model, key=lambda t: -model[t] * (self.idf(t) if by_idf else 1.0))[:terms]
        z = sum(model[t] for t in chosen) or 1.0
        weights = {t: lam / len(query) for t in query}
        for t in chosen:
            weights[t] = weights.get(t, 0.0) + (1 - lam) * model[t] / z
        return weights


def rm3_lists(cache: dict, store: tuple) -> dict[str, list[dict]]:
    run_settings, specs, postings, _ = store
    ft = _Fulltext(postings, run_settings.fulltext.k1, run_settings.fulltext.b)
    out: dict[str, list[dict]] = {_rm3_name(x): [] for x in RM3}
    for q in cache["queries"]:
        ns = specs[q["id"]].options.get("namespace")
        ns_code = ft.p.labels.get(("namespace", ns)) if ns else None
        query = list(ft.p.termids([t for t, _ in q["terms"]]).values())
        first = ft.search({t: 1.0 for t in query}, ns_code) if query else []
        for x in RM3:
            hits = ft.search(ft.rm3(query, first, *x), ns_code) if query else []
            out[_rm3_name(x)].append({**q, "fts": [[ft.p.ids[d], s] for d, s in hits]})
    return out


def rocchio_lists(cache: dict, store: tuple) -> dict[str, list[dict]]:
    from pipeline.embedders import make_embedder

    run_settings, specs, _, index = store
    emb, ids = np.asarray(index.emb, dtype=np.float32), index.ids
    queries = np.asarray(make_embedder(run_settings).embed([q["text"] for q in cache["queries"]]), dtype=np.float32)
    out: dict[str, list[dict]] = {"exact": [], **{_rocchio_name(x): [] for x in ROCCHIO}}

    def top(vec: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        sims = emb @ vec
        if mask is not None:
            sims = np.where(mask, sims, -np.inf)
        order = np.argsort(-sims, kind="stable")[:100]
        return order[np.isfinite(sims[order])], sims

    for q, vec in zip(cache["queries"], queries, strict=True):
        ns = specs[q["id"]].options.get("namespace")
        mask: np.ndarray | None = index.ns_code == index.namespaces.index(ns) if ns else None
        first, sims = top(vec, mask)
        out["exact"].append({**q, "vector": [[ids[j], float(sims[j])] for j in first]})
        for k, beta in ROCCHIO:
            moved = vec + beta * emb[first[:k]].mean(axis=0)
            again, sims2 = top(moved / np.linalg.norm(moved), mask)
            out[_rocchio_name((k, beta))].append({**q, "vector": [[ids[j], float(sims2[j])] for j in again]})
    return out


def _rm3_name(x: tuple) -> str:
    d, t, lam, by_idf = x
    return f"rm3 docs {d} terms {t} lam {lam}" + (" idf" if by_idf else "")


def _rocchio_name(x: tuple) -> str:
    return f"rocchio k {x[0]} beta {x[1]}"


def compare(baseline: list[dict], variants: dict[str, list[dict]], leg: str) -> tuple[dict, dict, dict]:
    """Each variant's leg alone on every set, and the two leave-one-set-out pools."""
    result = joint({NOW: baseline, **variants}, NOW)
    alone = {name: evaluate(caches, [leg])["table"][leg] for name, caches in {NOW: baseline, **variants}.items()}
    runs = {"alpha alone": leave_one_out(result, ("convex",)),
            "alpha and the variants": leave_one_out(result, ("convex", "convex+bm25"))}
    return result, alone, runs


def markdown(title: str, result: dict, alone: dict, runs: dict, leg: str) -> str:
    sets = result["sets"]
    lines = [f"**{title}**: the {leg} leg alone, nDCG@10 / R@10:", "",
             "| variant | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]
    for name, row in alone.items():
        lines.append(f"| {name} | " + " | ".join(f"{row[s]['ndcg@10']:.3f} / {row[s]['recall@10']:.3f}" for s in sets) + " |")
    lines += ["", "| pool | mean nDCG@10 left out | " + " | ".join(f"{s} left out" for s in sets) + " | chosen on all six |",
              "|---|---|" + "---|" * len(sets) + "---|"]
    for pool, run in runs.items():
        cells = [f"{f['ndcg@10']:.3f} / {f['recall@10']:.3f} ({f['chosen']})" for f in run["folds"]]
        lines.append(f"| {pool} | {run['left_out_mean']:.4f} | " + " | ".join(cells)
                     + f" | {run['final']} ({run['final_mean']:.4f}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--caches", type=Path, required=True, help="ops.bench.fusion cache's default caches, one per set")
    p.add_argument("--data-dir", type=Path, required=True, help="their stores, one folder per set")
    p.add_argument("--beir-root", type=Path, default=Path("../shared/data/beir"), help="the BEIR sets' folders")
    p.add_argument("--locomo", type=Path, default=Path("../shared/data/locomo/locomo10.json"))
    p.add_argument("--md", type=Path)
    args = p.parse_args(argv)
    caches = [json.loads(f.read_text(encoding="utf-8")) for f in sorted(args.caches.glob("*.json"))]
    rm3: dict[str, list[dict]] = {}
    rocchio: dict[str, list[dict]] = {}
    for cache in caches:
        store = _open(cache["set"], args.data_dir,
                      args.locomo if cache["set"] == "locomo" else args.beir_root / cache["set"])
        for name, queries in rm3_lists(cache, store).items():
            rm3.setdefault(name, []).append({**cache, "queries": queries})
        for name, queries in rocchio_lists(cache, store).items():
            rocchio.setdefault(name, []).append({**cache, "queries": queries})
        print(f"{cache['set']}: lists built", flush=True)
    exact = rocchio.pop("exact")
    md = (markdown("RM3 on the full-text leg", *compare(caches, rm3, "fts only"), leg="fts only") + "\n"
          + markdown("Rocchio on the vector leg (exact search both sides)", *compare(exact, rocchio, "vector only"),
                     leg="vector only"))
    print(md)
    if args.md:
        args.md.write_text(md, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
