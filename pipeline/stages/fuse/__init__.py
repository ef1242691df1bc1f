"""The ``search.fuse`` stage: the legs' lists become one, by convex fusion
(the default) or reciprocal rank fusion, then the recency boost where a query
asks for it (``recency``, a helper of this stage).

``fusion = "convex"`` (the default; a setting, or a query's option): each
leg's scores min-max normalised over the hits it returned, then ``sum of
w_leg / sum(w) * norm_leg(d)``, a memory a leg did not return scoring 0 from
it; hybrid weights default to ``convex_alpha`` : ``1 - convex_alpha``. The
convex combination of normalised scores is Bruch, Gai & Ingber's (ACM TOIS
2023, "An Analysis of Fusion Functions for Hybrid Retrieval").

``fusion = "rrf"`` (the seed's): ``score(d) = sum over legs of w_leg / (k +
rank_leg(d))`` (Cormack, Clarke & Buettcher, SIGIR 2009), hybrid weights
``vector_weight`` / ``fts_weight``, k = ``rrf_k``. Ties in either keep a
stable order: best single rank first, then memory id. Every default was
chosen leaving one judged set out in turn (BENCHMARKS.md, "Fusion defaults
chosen leave one set out (issue 31)").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from pipeline.contracts import LEGS, Batch, Fused, Fusion, LegRun, QueryState, fusion_for
from pipeline.settings import Settings
from pipeline.stages.fuse.recency import apply_recency
from pipeline.stages.stage import Resources, Stage
from pipeline.timing import ms_since


def rrf(legs: dict[str, list[str]], weights: dict[str, float], k: int) -> list[Fused]:
    """Fuse ranked id lists (best first) into one list, best first."""
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for leg in sorted(legs):
        weight = weights.get(leg, 1.0)
        for rank, memory_id in enumerate(legs[leg], start=1):
            ranks.setdefault(memory_id, {})[leg] = rank
            scores[memory_id] = scores.get(memory_id, 0.0) + weight / (k + rank)
    order = sorted(scores, key=lambda m: (-scores[m], min(ranks[m].values()), m))
    return [Fused(id=m, rrf=scores[m], score=scores[m], ranks=ranks[m]) for m in order]


def convex(legs: dict[str, list[tuple[str, float]]], weights: dict[str, float]) -> list[Fused]:
    """Fuse ranked (id, score) lists (best first) by a weighted sum of each
    leg's min-max normalised scores, best first. A leg's weight counts as its
    share of the weights' sum; a leg with one score (or all equal) gives its
    hits 1."""
    total = sum(weights.get(leg, 1.0) for leg in legs) or 1.0
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for leg in sorted(legs):
        hits = legs[leg]
        share = weights.get(leg, 1.0) / total
        if not hits:
            continue
        values = [s for _, s in hits]
        lo, span = min(values), max(values) - min(values)
        for rank, (memory_id, value) in enumerate(hits, start=1):
            ranks.setdefault(memory_id, {})[leg] = rank
            norm = (value - lo) / span if span > 0 else 1.0
            scores[memory_id] = scores.get(memory_id, 0.0) + share * norm
    order = sorted(scores, key=lambda m: (-scores[m], min(ranks[m].values()), m))
    return [Fused(id=m, rrf=scores[m], score=scores[m], ranks=ranks[m]) for m in order]


def _own(state: QueryState) -> QueryState:
    """A copy of ``state`` owning what merging and fusing change (its query,
    legs and timings); the rest is shared, never changed in place. A deep copy
    took ~0.3 ms of a keyword query, more with a hundred hits per leg."""
    return state.model_copy(update={"query": state.query.model_copy(), "timings": dict(state.timings),
                                    "legs": {name: leg.model_copy() for name, leg in state.legs.items()}})


def merge_legs(parts: list[Batch]) -> Batch:
    """Join the chord's header results (one batch per leg) into one batch;
    the parts are left as they were."""
    base = Batch(states=[_own(s) for s in parts[0].states])
    for other in parts[1:]:
        if len(other.states) != len(base.states):
            raise ValueError("chord parts disagree on the number of queries")
        for state, theirs in zip(base.states, other.states):
            if state.query.id != theirs.query.id:
                raise ValueError("chord parts disagree on query order")
            for name, leg in theirs.legs.items():
                if leg.ran or name not in state.legs:
                    state.legs[name] = leg.model_copy()  # fusion cuts its hits: not the part's
            for stage, ms in theirs.timings.items():
                state.timings.setdefault(stage, ms)
            if theirs.query.vector is not None:
                state.query.vector = theirs.query.vector
    return base


def fuse_state(state: QueryState, k: int) -> QueryState:
    """Convex fusion or RRF, as the query asks, over the legs that ran (weight > 0)."""
    t0 = time.perf_counter()
    # every leg, in LEGS order, whichever legs the canvas ran (a leg no query
    # of the batch wants is left out of it: ``Batch.legs``)
    state.legs = {name: state.legs[name] if name in state.legs else LegRun(leg=name) for name in LEGS}
    ran = {name: leg for name, leg in state.legs.items() if leg.ran and state.query.weights.get(name, 0) > 0}
    if state.query.fusion is Fusion.convex:
        state.fused = convex({name: [(h.id, h.score) for h in leg.hits] for name, leg in ran.items()},
                             state.query.weights)
    else:
        state.fused = rrf({name: [h.id for h in leg.hits] for name, leg in ran.items()}, state.query.weights, k)
    # consumed: the leg ranks live on in ``fused``; keep the wire small
    state.query.vector = None
    for leg in state.legs.values():
        leg.keep_top()
    state.timings["fuse"] = ms_since(t0)
    return state


def fuse_batch(parts: list[Batch], k: int, created_at_of: Callable[[list[str]], dict[str, datetime]],
               settings: Settings | None = None) -> Batch:
    """The ``search.fuse`` stage: merge the legs, fuse, apply recency where asked.

    With ``settings`` (the serving process's, tuned values included), the
    weights and fusion a query's options leave open are resolved again from
    them (``fusion_for``): the store's tuned fusion holds whichever process
    made the query."""
    batch = merge_legs(parts)
    for state in batch.states:
        if settings is not None:
            state.query.weights, state.query.fusion = fusion_for(state.query.options, settings)
        fuse_state(state, k)
        boost = state.query.options.recency_boost
        if boost > 0 and state.fused:
            t0 = time.perf_counter()
            now = state.query.options.now or state.query.started_utc
            state.fused = apply_recency(state.fused, created_at_of([f.id for f in state.fused]), boost, now)
            state.timings["recency"] = ms_since(t0)
    return batch


def run(parts: list[Batch], res: Resources) -> Batch:
    """``fuse_batch`` over the published store (created-at from the view; none without a store)."""
    settings = res.settings()
    with res.view() as v:
        created = v.created_at if v is not None else _nothing_created
        return fuse_batch(parts, settings.rrf_k, created, settings)


def _nothing_created(ids: list[str]) -> dict[str, datetime]:
    return {}


STAGE = Stage("search.fuse", run, fan_in=True)
