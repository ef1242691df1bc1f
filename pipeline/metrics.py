"""Retrieval metrics over a run and graded qrels (Jarvelin & Kekalainen 2002
for nDCG; binary recall and reciprocal rank). Checked against ranx in tests.

A run is ``{query_id: [doc_id, ...]}`` best first; qrels are
``{query_id: {doc_id: grade}}`` with grade > 0 relevant.
"""

from __future__ import annotations

import math
from statistics import mean


def ndcg_at(ranked: list[str], rels: dict[str, int], k: int) -> float:
    """nDCG@k with linear gain (grade / log2(rank + 1)), ranx's default."""
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted((g for g in rels.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at(ranked: list[str], rels: dict[str, int], k: int) -> float:
    relevant = {d for d, g in rels.items() if g > 0}
    if not relevant:
        return 0.0
    return len(relevant & set(ranked[:k])) / len(relevant)


def mrr_at(ranked: list[str], rels: dict[str, int], k: int) -> float:
    for i, d in enumerate(ranked[:k]):
        if rels.get(d, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


METRICS = {
    "ndcg@10": lambda r, q: ndcg_at(r, q, 10),
    "recall@5": lambda r, q: recall_at(r, q, 5),
    "recall@10": lambda r, q: recall_at(r, q, 10),
    "recall@50": lambda r, q: recall_at(r, q, 50),
    "mrr@10": lambda r, q: mrr_at(r, q, 10),
}


def evaluate(run: dict[str, list[str]], qrels: dict[str, dict[str, int]], metrics=None) -> dict[str, float]:
    """Mean of each metric over the queries that have judgments."""
    names = metrics or list(METRICS)
    scored = [q for q in qrels if any(g > 0 for g in qrels[q].values())]
    if not scored:
        return {name: 0.0 for name in names}
    return {name: mean(METRICS[name](run.get(q, []), qrels[q]) for q in scored) for name in names}
