"""Recency boost: ``final = rrf * (1 + recencyBoost * 1 / (1 + ageDays))``.

Hyperbolic decay; age is measured from the query's ``now`` (a caller may fix
it so replays are deterministic). The re-rank is stable: equal final scores
keep their fused order.
"""

from __future__ import annotations

from datetime import datetime

from pipeline.contracts import Fused


def recency_factor(created_at: datetime, now: datetime) -> float:
    """``1 / (1 + ageDays)``; a memory from the future counts as age 0."""
    age_days = max((now - created_at).total_seconds() / 86400.0, 0.0)
    return 1.0 / (1.0 + age_days)


def apply_recency(fused: list[Fused], created: dict[str, datetime], boost: float, now: datetime) -> list[Fused]:
    """Boost each fused score by recency and re-rank stably. A memory missing
    from ``created`` (not live in fusion's snapshot: a leg's process saw a
    write, or a forget, that this one has not yet) gets no boost; augment
    keeps or drops it by its own snapshot."""
    if boost <= 0:
        return fused
    for item in fused:
        at = created.get(item.id)
        factor = recency_factor(at, now) if at is not None else 0.0
        item.recency_factor = factor
        item.score = item.rrf * (1.0 + boost * factor)
    return sorted(fused, key=lambda f: -f.score)  # sorted() is stable
