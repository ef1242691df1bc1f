"""Paired comparison of runs over the same judged queries: significance tests
with a reproducible seed (``metrics.paired_p_value``), the queries that gained
and lost most, and rank changes against the baseline.
"""

from __future__ import annotations

import numpy as np

from pipeline.audit.explain import diff_served
from pipeline.errors import InputError
from pipeline.evaluation.metrics import METRICS, paired_p_value, score
from pipeline.evaluation.models import Comparison, DeltaRow, LegTest, ModeComparison, Pair, RunReport
from pipeline.evaluation.runs import first_relevant


# -- comparisons -------------------------------------------------------------------------------
def compare(
    reports: list[RunReport],
    runs: list[dict[str, list[str]]],
    qrels: dict[str, dict[str, int]],
    *,
    metric: str = "ndcg@10",
    stat_test: str = "fisher",
    seed: int = 42,
    max_p: float = 0.05,
    top: int = 10,
    k: int = 10,
) -> Comparison:
    """Compare runs of the same judged queries, the first being the baseline.

    Paired significance of each run against the baseline on every metric
    (``fisher``: randomised permutation test with a fixed seed; or
    ``student``: paired t-test), over the queries every run answered; per other
    run, the queries that gained and lost most on ``metric`` and rank-change
    statistics of the top ``k`` against the baseline (``diff_served``:
    overlap@k, identical lists, moves).
    """
    names = [r["name"] for r in reports]
    if len(set(names)) != len(names):
        raise InputError("RUN", f"run names must differ: {names}")
    # Scored queries of every report (a query answered with no results has no
    # line in run.trec but is scored 0), as the reports scored them.
    common = sorted(set.intersection(*(set(r["per_query"]) for r in reports)) & set(qrels))
    runs = [{q: run.get(q, []) for q in common} for run in runs]
    if not common:
        raise InputError("RUN", "the runs share no judged query")
    metrics = list(METRICS)
    judged = {q: qrels[q] for q in common}
    scored = [score(run, judged, metrics) for run in runs]
    per_metric = [{m: [per_query[q][m] for q in common] for m in metrics} for _, per_query in scored]
    base_scores = reports[0]["per_query"]
    pairs: list[Pair] = []
    for other, run, figures in zip(reports[1:], runs[1:], per_metric[1:]):
        p_values = {m: paired_p_value(per_metric[0][m], figures[m], stat_test=stat_test, seed=seed) for m in metrics}
        deltas = sorted(
            ((q, other["per_query"][q][metric] - base_scores[q][metric]) for q in common),
            key=lambda x: (x[1], x[0]),
        )
        diffs = [diff_served(runs[0][q], run[q], k) for q in common]
        firsts = [(first_relevant(runs[0][q], qrels[q]), first_relevant(run[q], qrels[q])) for q in common]
        better = sum(1 for a, b in firsts if b is not None and (a is None or b < a))
        worse = sum(1 for a, b in firsts if a is not None and (b is None or b > a))
        pairs.append({
            "baseline": names[0],
            "run": other["name"],
            "metric": metric,
            "mean_delta": round(float(np.mean([d for _, d in deltas])), 6),
            "p_values": p_values,
            "significant": {m: p < max_p for m, p in p_values.items()},
            "gained": [_delta_row(q, d, reports[0], other, metric)
                       for q, d in sorted(deltas, key=lambda x: (-x[1], x[0]))[:top] if d > 0],
            "lost": [_delta_row(q, d, reports[0], other, metric) for q, d in deltas[:top] if d < 0],
            "per_query_delta": {q: round(d, 6) for q, d in deltas},
            "wins_ties_losses": [sum(1 for _, d in deltas if d > 0), sum(1 for _, d in deltas if d == 0),
                                 sum(1 for _, d in deltas if d < 0)],
            "rank_changes": {
                "k": k,
                "mean_overlap": round(float(np.mean([d["overlap"] for d in diffs])), 4),
                "identical_lists": sum(1 for d in diffs if d["same"]),
                "mean_moved": round(float(np.mean([d["moved"] for d in diffs])), 3),
                "mean_abs_shift_of_moved": round(float(np.mean([d["mean_abs_shift"] for d in diffs if d["moved"]] or [0.0])), 3),
                "first_relevant_better": better,
                "first_relevant_worse": worse,
                "first_relevant_same": len(common) - better - worse,
            },
        })
    return {
        "runs": names,
        "queries": len(common),
        "stat_test": stat_test,
        "seed": seed,
        "max_p": max_p,
        "metrics": {n: {m: round(means[m], 6) for m in metrics} for n, (means, _) in zip(names, scored)},
        "configs": {r["name"]: r.get("config", {}) for r in reports},
        "latency_ms": {r["name"]: r.get("latency_ms", {}) for r in reports},
        "queries_per_s": {r["name"]: r.get("queries_per_s") for r in reports},
        "pairs": pairs,
    }


def against_legs(
    reports: dict[str, RunReport],
    runs: dict[str, dict[str, list[str]]],
    qrels: dict[str, dict[str, int]],
    *,
    subject: str = "hybrid",
    metric: str = "ndcg@10",
    stat_test: str = "fisher",
    seed: int = 42,
    max_p: float = 0.05,
    store_versions: dict[str, int | None] | None = None,
) -> tuple[ModeComparison, dict[str, Comparison]]:
    """``subject`` (hybrid) against every other mode of one run of ``dimple
    eval --mode all``: for each leg, ``compare`` with the leg as baseline (the
    paired test on per-query ``metric``, hybrid minus leg). Returns the
    summary (``modes.json``) and each leg's full comparison."""
    if subject not in reports:
        raise InputError("--mode", f"no {subject} run to test against the legs")
    legs = [m for m in reports if m != subject]
    full: dict[str, Comparison] = {}
    tests: list[LegTest] = []
    for leg in legs:
        c = compare([reports[leg], reports[subject]], [runs[leg], runs[subject]], qrels,
                    metric=metric, stat_test=stat_test, seed=seed, max_p=max_p)
        pair = c["pairs"][0]
        full[leg] = c
        tests.append({"leg": leg, "metric": metric, "mean_delta": pair["mean_delta"],
                      "p_value": float(pair["p_values"][metric]), "significant": bool(pair["significant"][metric]),
                      "wins_ties_losses": pair["wins_ties_losses"],
                      "p_values": {m: float(v) for m, v in pair["p_values"].items()}})
    first = next(iter(full.values()), None)
    return {
        "modes": list(reports),
        "queries": first["queries"] if first else len(next(iter(reports.values()))["per_query"]),
        "store_versions": dict(store_versions or {}),
        "stat_test": stat_test,
        "seed": seed,
        "max_p": max_p,
        "metrics": {m: dict(r["metrics"]) for m, r in reports.items()},
        "queries_per_s": {m: r.get("queries_per_s") for m, r in reports.items()},
        "tests": tests,
    }, full


def _delta_row(q: str, delta: float, base: RunReport, other: RunReport, metric: str) -> DeltaRow:
    return {"id": q, "text": base["per_query"][q].get("text", ""), "delta": round(delta, 6),
            "before": base["per_query"][q][metric], "after": other["per_query"][q][metric]}
