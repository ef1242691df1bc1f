"""Reciprocal rank fusion (Cormack, Clarke & Buettcher, SIGIR 2009).

``score(d) = sum over legs of w_leg / (k + rank_leg(d))`` with k = 60 by
default (ranx's ``rrf(runs, k=60)``). Ties keep a stable order: best single
rank first, then memory id.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from pipeline.contracts import LEGS, Batch, Fused, LegRun, QueryState
from pipeline.stages.recency import apply_recency
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


def merge_legs(parts: list[Batch]) -> Batch:
    """Join the chord's header results (one batch per leg) into one batch."""
    base = parts[0].model_copy(deep=True)
    for other in parts[1:]:
        if len(other.states) != len(base.states):
            raise ValueError("chord parts disagree on the number of queries")
        for state, theirs in zip(base.states, other.states):
            if state.query.id != theirs.query.id:
                raise ValueError("chord parts disagree on query order")
            for name, leg in theirs.legs.items():
                if leg.ran or name not in state.legs:
                    state.legs[name] = leg
            for stage, ms in theirs.timings.items():
                state.timings.setdefault(stage, ms)
            if theirs.query.vector is not None:
                state.query.vector = theirs.query.vector
    return base


def fuse_state(state: QueryState, k: int) -> QueryState:
    """RRF over the legs that ran (weight > 0), then the optional recency boost."""
    t0 = time.perf_counter()
    for name in LEGS:
        state.legs.setdefault(name, LegRun(leg=name))
    lists = {
        name: [h.id for h in leg.hits]
        for name, leg in state.legs.items()
        if leg.ran and state.query.weights.get(name, 0) > 0
    }
    state.fused = rrf(lists, state.query.weights, k)
    # consumed: the leg ranks live on in ``fused``; keep the wire small
    state.query.vector = None
    for leg in state.legs.values():
        leg.keep_top()
    state.timings["fuse"] = ms_since(t0)
    return state


def fuse_batch(parts: list[Batch], k: int, created_at_of: Callable[[list[str]], dict[str, datetime]]) -> Batch:
    """The ``search.fuse`` stage: merge the legs, fuse, apply recency where asked."""
    batch = merge_legs(parts)
    for state in batch.states:
        fuse_state(state, k)
        boost = state.query.options.recency_boost
        if boost > 0 and state.fused:
            t0 = time.perf_counter()
            now = state.query.options.now or state.query.started_utc
            state.fused = apply_recency(state.fused, created_at_of([f.id for f in state.fused]), boost, now)
            state.timings["recency"] = ms_since(t0)
    return batch
