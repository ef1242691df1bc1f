"""Budgets: maxUnits, maxChars, maxMs, applied in rank order.

A result that does not fit ends the list: a lower-ranked one never jumps
ahead. ``truncated`` is true with the budget that cut and how many results
were left out. maxMs counts from the query's start; legs stop at the deadline
(their profile says ``timed_out``) and the query reports the cut.
"""

from __future__ import annotations

import time

from pipeline.contracts import Batch, QueryState, Truncation


def apply_budget(state: QueryState) -> QueryState:
    q = state.query
    results = state.results
    keep = len(results)
    # candidates augment counted but did not carry (past max_units) are left out too
    total = len(results) + state.beyond_budget
    cut: Truncation | None = None
    if q.max_units is not None and total > q.max_units:
        keep = min(keep, q.max_units)
        cut = Truncation(by="maxUnits", left_out=total - keep, limit=q.max_units)
    if q.max_chars is not None:
        used = 0
        for i, result in enumerate(results[:keep]):
            used += len(result.content)
            if used > q.max_chars:
                cut = Truncation(by="maxChars", left_out=total - i, limit=q.max_chars)
                keep = i
                break
    slow = sorted(name for name, leg in state.legs.items() if leg.profile.get("timed_out"))
    if slow and q.max_ms is not None:
        cut = Truncation(
            by="maxMs", left_out=total - keep, limit=q.max_ms,
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
        state.timings["budget"] = round((time.perf_counter() - t0) * 1000, 3)
    return batch
