"""Budgets: maxUnits, maxChars, maxMs, applied in rank order.

A result that does not fit ends the list: a lower-ranked one never jumps
ahead. ``truncated`` is true with the budget that cut and how many results
were left out. maxMs counts from the query's start; legs stop at the deadline
(their profile says ``timed_out``) and the query reports the cut.
"""

from __future__ import annotations

import time

from pipeline.contracts import Batch, QueryState, Truncation
from pipeline.stages.stage import Resources, Stage
from pipeline.timing import ms_since


def apply_budget(state: QueryState) -> QueryState:
    budget = state.query.budget
    results = state.results
    keep = len(results)
    # candidates augment counted but did not carry (past max_units) are left out too
    total = len(results) + state.beyond_budget
    cut: Truncation | None = None
    if budget.max_units is not None and total > budget.max_units:
        keep = min(keep, budget.max_units)
        cut = Truncation(by="maxUnits", left_out=total - keep, limit=budget.max_units)
    if budget.max_chars is not None:
        used = 0
        for i, result in enumerate(results[:keep]):
            used += len(result.content)
            if used > budget.max_chars:
                cut = Truncation(by="maxChars", left_out=total - i, limit=budget.max_chars)
                keep = i
                break
    slow = sorted(name for name, leg in state.legs.items() if leg.profile.get("timed_out"))
    if slow and budget.max_ms is not None:
        cut = Truncation(
            by="maxMs", left_out=total - keep, limit=budget.max_ms,
            detail=f"deadline reached before leg(s) finished: {', '.join(slow)}",
        )
    state.results = results[:keep]
    state.truncated = cut is not None
    state.truncation = cut
    return state


def budget_batch(batch: Batch) -> Batch:
    """The ``search.budget`` stage."""
    for state in batch.states:
        t0 = time.perf_counter()
        apply_budget(state)
        state.timings["budget"] = ms_since(t0)
    return batch


def run(batch: Batch, res: Resources) -> Batch:
    return budget_batch(batch)


STAGE = Stage("search.budget", run)
