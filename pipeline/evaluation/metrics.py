"""Retrieval metrics and paired significance tests: one definition for
``dimple demo``, ``dimple eval`` and the benchmarks.

The definitions are ranx's (Bassani 2022), computed here in plain Python and
numpy; ``tests/unit/test_metrics.py`` checks them against hand-worked values
and against ranx itself. ranx is not used at run time: it compiles its
functions with numba, which cost a new install's first ``dimple demo`` over a
minute and every ``dimple eval`` process several seconds (BENCHMARKS.md,
"Metrics without ranx at run time"), for sums over at most a few thousand
queries of ten results.

- A memory is relevant when its grade is at least 1 (ranx's ``rel_lvl``).
- ``ndcg@k``: Järvelin & Kekäläinen 2002, gain = grade, discount log2(rank + 1),
  over the ideal ordering of the query's grades.
- ``recall@k``: relevant memories in the top k over all relevant memories.
- ``precision@k``: relevant memories in the top k over k (not over the list's
  length, as ranx).
- ``mrr@k``: 1 / rank of the first relevant memory in the top k, else 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from pipeline.errors import InputError

METRICS = ("ndcg@10", "recall@5", "recall@10", "recall@50", "mrr@10", "precision@5", "precision@10")
FAMILIES = ("ndcg", "recall", "precision", "mrr")
STAT_TESTS = ("fisher", "student")
PERMUTATIONS = 1000  # ranx's default for its randomisation test


def parse_metric(metric: str) -> tuple[str, int]:
    """``"ndcg@10"`` -> ``("ndcg", 10)``; a typed error naming the metric otherwise."""
    family, _, k = metric.partition("@")
    if family not in FAMILIES or not k.isdigit() or int(k) < 1:
        raise InputError("metrics", f"unknown metric {metric!r}: one of {', '.join(FAMILIES)} with @k, k >= 1 "
                                    "(e.g. ndcg@10)")
    return family, int(k)


def _query_scores(ranked: list[str], grades: dict[str, int],
                  metrics: list[tuple[str, str, int]]) -> dict[str, float]:
    """Each metric (name, family, k) of one query's ranked memory ids against
    its graded judgments. A memory listed twice counts at its first rank only.
    """
    relevant = {d: g for d, g in grades.items() if g >= 1}
    gains, seen = [], set()
    for d in ranked:
        if d not in seen:
            seen.add(d)
            gains.append(relevant.get(d, 0))
    out = {}
    for metric, family, k in metrics:
        top = gains[:k]
        if not relevant:
            value = 0.0
        elif family == "ndcg":
            ideal = sorted(relevant.values(), reverse=True)[:k]
            value = _dcg(top) / _dcg(ideal)
        elif family == "recall":
            value = sum(1 for g in top if g) / len(relevant)
        elif family == "precision":
            value = sum(1 for g in top if g) / k
        else:
            value = next((1 / (i + 1) for i, g in enumerate(top) if g), 0.0)
        out[metric] = value
    return out


def _dcg(gains: list[int]) -> float:
    return sum(g / math.log2(i + 2) for i, g in enumerate(gains) if g)


def score(
    run: dict[str, list[str]], qrels: dict[str, dict[str, int]], metrics: Iterable[str] = METRICS
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(mean per metric, per query per metric) over the judged queries of
    ``qrels`` (those with a grade of at least 1); a judged query missing from
    the run scores 0."""
    names = list(metrics)
    parsed = [(m, *parse_metric(m)) for m in names]  # every name checked once, before any query
    judged = {q: d for q, d in qrels.items() if any(g >= 1 for g in d.values())}
    if not judged:
        return {m: 0.0 for m in names}, {}
    per_query = {q: _query_scores(run.get(q, []), grades, parsed) for q, grades in judged.items()}
    means = {m: float(np.mean([per_query[q][m] for q in judged])) for m in names}
    return means, per_query


def paired_p_value(
    control: Iterable[float], treatment: Iterable[float], *, stat_test: str = "fisher",
    seed: int = 42, permutations: int = PERMUTATIONS,
) -> float:
    """Two-sided p-value that two systems' per-query scores (same queries, same
    order) have the same mean.

    ``fisher``: the randomisation test (Smucker et al., CIKM 2007, as ranx runs
    it): each permutation swaps each query's pair of scores with probability
    1/2; p is the share of ``permutations`` whose absolute difference of means
    is at least the observed one. Reproducible for a given ``seed``.
    ``student``: the paired t-test (scipy's ``ttest_rel``). Where the scores do
    not differ at all, p is 1.
    """
    if stat_test not in STAT_TESTS:
        raise InputError("stat_test", f"unknown test {stat_test!r}: one of {', '.join(STAT_TESTS)}")
    diff = np.asarray(list(treatment), dtype=np.float64) - np.asarray(list(control), dtype=np.float64)
    if not diff.size or not diff.any():
        return 1.0
    if stat_test == "student":
        from scipy.stats import ttest_rel  # scipy's import costs ~1 s, for the t-test only

        p = float(ttest_rel(diff, np.zeros_like(diff)).pvalue)
        return 1.0 if math.isnan(p) else p
    observed = abs(diff.sum())
    # Sums, not means: the same order, one division less. The tolerance keeps
    # a permutation that equals the observed sum (rounded otherwise) counted.
    tolerance = 1e-9 * max(1.0, observed)
    rng = np.random.default_rng(seed)
    hits, chunk = 0, max(1, 4_000_000 // diff.size)
    for start in range(0, permutations, chunk):
        n = min(chunk, permutations - start)
        signs = rng.integers(0, 2, size=(n, diff.size), dtype=np.int8).astype(np.float64) * 2.0 - 1.0
        hits += int(np.count_nonzero(np.abs(signs @ diff) >= observed - tolerance))
    return hits / permutations
