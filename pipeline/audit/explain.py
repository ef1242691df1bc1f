"""Explaining and replaying a logged query: each result's path from the row
alone, the options that re-run it as it was asked, and the one definition of
"what changed" between two served lists.
"""

from __future__ import annotations

from typing import Any

from pipeline.audit.record import AuditRecord
from pipeline.contracts import Origin, options_from_recorded


# -- explain --------------------------------------------------------------------------
def explain(record: AuditRecord) -> list[dict[str, Any]]:
    """Each result's path, from the row alone: leg ranks, RRF contribution per
    leg (``w / (k + rank)``; a row written before issue 31 may hold the rank
    RRF counted instead, ``tied_ranks``: a full-text tie group's average, or
    nothing for a hit under the full-text floor), recency factor, final score
    and rank, and for a successor that
    supersession placed above a superseded result, that result
    (``promoted_above``).

    A query fused by ``convex`` has no per-leg terms: the row keeps each
    leg's ranks, not the scores the min-max normalisation read, so its path
    gives the fused score (``fusion``: ``"convex"``) without
    ``rrf_contributions``."""
    weights = record.query_profile.get("weights", {})
    fusion = options_from_recorded(record.options).get("fusion") or "rrf"
    out = []
    for src in record.sources:
        counted = src.get("tied_ranks") or {}  # rows from before issue 31: the rank issue 16's rules counted
        terms = {} if fusion != "rrf" else {"rrf_contributions": {
            leg: _contribution(weights.get(leg, 1.0), record.rrf_k, counted.get(leg, rank))
            for leg, rank in sorted(src["ranks"].items())
        }}
        out.append({
            "rank": src["rank"],
            "id": src["id"],
            "fusion": fusion,
            "leg_ranks": src["ranks"],
            **({"tied_ranks": counted} if counted else {}),
            **terms,
            "rrf": src["rrf"],
            "recency_factor": src["recency_factor"],
            "score": src["score"],
            "promoted_above": src.get("promoted_above"),
        })
    return out


def _contribution(weight: float, k: int, counted: float | None) -> float:
    """One leg's RRF term; a rank counted as None (under the full-text floor) adds nothing."""
    return 0.0 if counted is None else weight / (k + counted)


# -- replay -----------------------------------------------------------------------------
def replay_options(record: AuditRecord) -> dict[str, Any]:
    """The search options that re-run a logged query as it was asked (scope,
    budgets, top-k, recency ``now``, requested mode): ``Query.recorded``'s inverse,
    marked as a replay (``Origin``), so its own audit row is never replayed."""
    return {**options_from_recorded(record.options), "mode": record.requested_mode, "origin": Origin.replay.value}


def store_changed(record: AuditRecord, now: int | None) -> str | None:
    """Why a replay may differ from what was served: the writes published
    between the row's store version and ``now`` (None when the same, or
    unknown), or a row the segment store of an earlier version logged."""
    segment = record.query_profile.get("segment_version")
    if segment is not None:  # carried by ``dimple migrate`` (``pipeline.audit.carry``)
        return (f"logged by the segment store of an earlier version (its version {segment}), replayed on the lake"
                + (f" at snapshot {now}" if now is not None else ""))
    then = record.query_profile.get("store_version")
    if then is None or now is None or then == now:
        return None
    return (f"the store changed since: version {then} then, {now} now "
            f"({now - then} write(s) or compaction(s) published in between)")


def diff_served(before: list[str], after: list[str], k: int | None = None) -> dict[str, Any]:
    """How a served list changed: one line per added, moved or dropped id, plus
    overlap@k (shared ids over the longer top-k; 1.0 when both are empty), the
    moves' mean absolute rank shift, and whether the lists are identical.

    The one definition of "what changed" used by ``dimple audit explain``,
    ``dimple eval replay`` and ``dimple eval compare``.
    """
    if k is not None:
        before, after = before[:k], after[:k]
    was = {mid: i for i, mid in enumerate(before, start=1)}
    now = {mid: i for i, mid in enumerate(after, start=1)}
    changes, shifts = [], []
    for mid, rank in now.items():
        if mid not in was:
            changes.append(f"+ {mid} now at rank {rank}")
        elif was[mid] != rank:
            changes.append(f"~ {mid} moved {was[mid]} -> {rank}")
            shifts.append(abs(was[mid] - rank))
    changes += [f"- {mid} (was rank {rank}) no longer served" for mid, rank in was.items() if mid not in now]
    longest = max(len(before), len(after))
    return {
        "same": before == after,
        "changes": changes,
        "overlap": len(was.keys() & now.keys()) / longest if longest else 1.0,
        "added": sum(1 for m in now if m not in was),
        "dropped": sum(1 for m in was if m not in now),
        "moved": len(shifts),
        "mean_abs_shift": sum(shifts) / len(shifts) if shifts else 0.0,
    }
