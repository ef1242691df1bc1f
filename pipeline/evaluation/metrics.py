"""Retrieval metrics: ranx's (Bassani 2022), one definition for ``dimple demo``,
``dimple eval`` and the benchmarks.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import numpy as np

METRICS = ("ndcg@10", "recall@5", "recall@10", "recall@50", "mrr@10", "precision@5", "precision@10")

# -- metrics (ranx) ------------------------------------------------------------------------
def id_codes(runs: Iterable[dict[str, list[str]]], qrels: dict[str, dict[str, int]]) -> dict[str, str]:
    """A code of one width (8 hex digits) for each memory id in ``runs`` and ``qrels``.

    ranx keeps a query's memory ids as a numpy string array, typed by its
    longest id, and numba compiles ranx's functions once per type: each new id
    width a query set brought compiled them all again (40-100 s on 2 cores,
    once per width per install; BENCHMARKS.md, "`dimple eval` after a new
    install"). The metrics only see which ranked ids are relevant, so coded
    ids give the same figures, and one compiled set serves every query set.
    """
    ids = {d for run in runs for docs in run.values() for d in docs} | {d for docs in qrels.values() for d in docs}
    return {d: f"{i:08x}" for i, d in enumerate(sorted(ids))}


def ranx_run(run: dict[str, list[str]], codes: dict[str, str], name: str = "run"):
    from ranx import Run

    # Rank-derived scores (n, n-1, ...): ranx sorts by score, so ties in fused
    # scores must not reorder what was served.
    return Run({q: {codes[d]: float(len(docs) - i) for i, d in enumerate(docs)} for q, docs in run.items()}, name=name)


def ranx_qrels(qrels: dict[str, dict[str, int]], codes: dict[str, str]):
    from ranx import Qrels

    return Qrels({q: {codes[d]: g for d, g in docs.items()} for q, docs in qrels.items()})


def score(
    run: dict[str, list[str]], qrels: dict[str, dict[str, int]], metrics: Iterable[str] = METRICS
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """ranx's figures: (mean per metric, per query per metric) over the judged
    queries of ``qrels``; a judged query missing from the run scores 0."""
    from ranx import evaluate

    names = list(metrics)
    judged = {q: d for q, d in qrels.items() if any(g > 0 for g in d.values())}
    if not judged:
        return {m: 0.0 for m in names}, {}
    full = {q: run.get(q, []) for q in judged}
    answered = {q: docs for q, docs in full.items() if docs}
    per_query: dict[str, dict[str, float]] = {q: {m: 0.0 for m in names} for q in judged}
    if answered:
        truth_of = {q: judged[q] for q in answered}
        codes = id_codes([answered], truth_of)
        scored, truth = ranx_run(answered, codes), ranx_qrels(truth_of, codes)
        # The same query ids on both sides, each sorted by id. Handing ranx the
        # qrels as its typed list skips its own check that the ids match, which
        # compiles numba's typed-dict key comparison in every new process (3 s).
        assert scored.get_query_ids() == truth.get_query_ids()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            evaluate(truth.to_typed_list(), scored, names, save_results_in_run=True)
        for m in names:
            for q, v in scored.scores[m].items():
                per_query[q][m] = float(v)
    means = {m: float(np.mean([per_query[q][m] for q in judged])) for m in names}
    return means, per_query
