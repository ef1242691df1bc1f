"""Running a query set and reporting on one run.

Everything here takes a *search function* (``search_many``-shaped: a list of
``{"query": ..., **options}`` in, one ``Results`` or exception per query out,
in order), so the same code runs embedded or through the broker and never
imports celery.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.contracts import Origin
from pipeline.errors import EvalFailed
from pipeline.evaluation.metrics import METRICS, score
from pipeline.evaluation.models import Latency, RunReport
from pipeline.evaluation.queries import QuerySet, QuerySpec

DEFAULT_MAX_UNITS = 100  # Recall@50 needs at least 50 results; the search default is 10

SearchMany = Callable[..., list[Any]]

# -- running -----------------------------------------------------------------------------
@dataclass
class QueryRun:
    """What one query got: ranked ids with scores, per-stage timings, or its error."""

    id: str
    ranked: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    total_ms: float = 0.0
    mode: str = ""
    error: str | None = None
    store_version: int | None = None


def run_queries(
    search_many: SearchMany,
    queries: list[QuerySpec],
    *,
    defaults: dict[str, Any] | None = None,
    batch_size: int = 64,
    in_flight: int | None = 8,
    progress: Callable[[int], None] | None = None,
    origin: Origin | None = None,
) -> tuple[list[QueryRun], float]:
    """Run every query through ``search_many`` in batches; returns one
    ``QueryRun`` per query (in order) and the wall-clock seconds.

    At most ``in_flight`` batches are on the workers at once, each with its
    own timeout, so a set of any size fits. A batch that fails (timeout,
    broker lost) marks its queries failed instead of ending the run.
    With ``origin``, every query is marked as asked by it, whatever its own
    options say (``dimple eval``: ``eval``, never replayed from the audit log).
    """
    mark = {"origin": origin.value} if origin is not None else {}
    asks = [{**q.ask(defaults or {}), **mark} for q in queries]
    t0 = time.perf_counter()
    answers = search_many(asks, batch_size, return_exceptions=True, progress=progress, in_flight=in_flight)
    secs = time.perf_counter() - t0
    out = []
    for q, res in zip(queries, answers):
        if isinstance(res, Exception):
            out.append(QueryRun(q.id, error=f"{type(res).__name__}: {res}"))
            continue
        out.append(QueryRun(
            q.id, [r.id for r in res.results], [r.score for r in res.results], dict(res.timings), res.total_ms, res.mode,
            store_version=res.store_version,
        ))
    return out, secs


def as_run(runs: Iterable[QueryRun]) -> dict[str, list[str]]:
    return {r.id: r.ranked for r in runs if r.error is None}


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    a = np.asarray(values, dtype=float)
    return {"n": int(a.size), "mean": round(float(a.mean()), 3), "p50": round(float(np.percentile(a, 50)), 3),
            "p95": round(float(np.percentile(a, 95)), 3), "p99": round(float(np.percentile(a, 99)), 3),
            "max": round(float(a.max()), 3)}


def latency(runs: list[QueryRun]) -> Latency:
    """Percentiles per stage (ms) over answered queries, and of ``total``
    (dispatch to results in hand). ``embed`` and ``augment`` are batch-wide:
    every query of a batch carries its batch's figure."""
    stages: dict[str, list[float]] = {}
    for r in runs:
        if r.error is not None:
            continue
        for stage, ms in r.timings.items():
            stages.setdefault(stage, []).append(ms)
        stages.setdefault("total", []).append(r.total_ms)
    return {stage: percentiles(v) for stage, v in sorted(stages.items())}

# -- one run's report ------------------------------------------------------------------------
def evaluate_run(
    qset: QuerySet,
    runs: list[QueryRun],
    seconds: float,
    *,
    config: dict[str, Any],
    name: str,
) -> RunReport:
    """The JSON report of one run: overall and per-query metrics, latency,
    throughput, what was skipped and which queries failed."""
    failed = {r.id: r.error for r in runs if r.error is not None}
    answered = [r for r in runs if r.error is None]
    if not answered:
        first = next(iter(failed.values()), "no queries")
        raise EvalFailed(f"every query of run {name!r} failed; first: {first}")
    run = as_run(runs)
    means, per_query = score(run, {q: qset.qrels[q] for q in run}, METRICS)
    by_id = {q.id: q for q in qset.queries}
    return {
        "name": name,
        "query_set": qset.name,
        "config": config,
        "queries": len(qset.queries),
        "answered": len(answered),
        "failed": failed,
        "skipped": {**{k: {"count": n, "ids": []} for k, n in qset.loader_skipped.items()},
                    **{k: {"count": len(v), "ids": v[:50]} for k, v in qset.skipped.items()}},
        "seconds": round(seconds, 3),
        "queries_per_s": round(len(runs) / seconds, 2) if seconds > 0 else None,
        "metrics": {m: round(v, 6) for m, v in means.items()},
        "per_query": {
            q: {"text": by_id[q].text, **{m: round(v, 6) for m, v in per_query[q].items()},
                "first_relevant_rank": first_relevant(run[q], qset.qrels[q])}
            for q in per_query
        },
        "latency_ms": latency(runs),
    }


def first_relevant(ranked: list[str], rels: dict[str, int]) -> int | None:
    for i, d in enumerate(ranked, start=1):
        if rels.get(d, 0) > 0:
            return i
    return None
