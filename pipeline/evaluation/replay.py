"""Replaying the audit log: logged queries re-run with their recorded options
against today's store and settings, each compared with what it was served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.audit.explain import diff_served, replay_options, store_changed
from pipeline.audit.record import AuditRecord
from pipeline.contracts import Origin, recorded_origin
from pipeline.errors import EvalInputError
from pipeline.evaluation.models import ReplayReport
from pipeline.evaluation.queries import QuerySpec
from pipeline.evaluation.runs import SearchMany, latency, run_queries


# -- replay of the audit log ------------------------------------------------------------------
def replay(
    search_many: SearchMany,
    records: list[AuditRecord],
    *,
    k: int = 10,
    batch_size: int = 64,
    in_flight: int | None = 8,
    progress: Callable[[int], None] | None = None,
) -> ReplayReport:
    """Re-run logged queries with their recorded options against the current
    store and settings; per query, ``diff_served`` of what was served then
    against what is served now (top ``k``). Rows without query text and rows
    of evaluation traffic (``Origin``: ``dimple eval`` and replays, which the
    workers log) are skipped (and counted)."""
    callers = [r for r in records if recorded_origin(r.options) is Origin.query]
    evaluation = [r.query_id for r in records if recorded_origin(r.options) is not Origin.query]
    usable = [r for r in callers if r.query_text is not None]
    skipped = [r.query_id for r in callers if r.query_text is None]
    if not usable:
        raise EvalInputError("audit log", f"no replayable rows ({len(records)} row(s), {len(skipped)} without query "
                                          f"text, {len(evaluation)} of evaluation traffic)")
    specs = [QuerySpec(r.query_id, r.query_text or "", replay_options(r)) for r in usable]
    runs, secs = run_queries(search_many, specs, batch_size=batch_size, in_flight=in_flight, progress=progress)
    rows: list[dict[str, Any]] = []
    for record, now in zip(usable, runs):
        before = [s["id"] for s in record.sources]
        if now.error is not None:
            rows.append({"query_id": record.query_id, "text": record.query_text, "error": now.error})
            continue
        diff = diff_served(before, now.ranked, k)
        rows.append({"query_id": record.query_id, "text": record.query_text, "logged_at": record.logged_at.isoformat(),
                     "mode": record.requested_mode, "before": before[:k], "after": now.ranked[:k], **diff,
                     "store_changed": store_changed(record, now.store_version)})
    done = [r for r in rows if "error" not in r]
    changed = sorted((r for r in done if not r["same"]), key=lambda r: (r["overlap"], r["query_id"]))
    return {
        "k": k,
        "rows": len(records),
        "replayed": len(done),
        "failed": {r["query_id"]: r["error"] for r in rows if "error" in r},
        "skipped": {reason: {"count": len(ids), "ids": ids[:50]}
                    for reason, ids in (("no_query_text", skipped), ("evaluation_traffic", evaluation)) if ids},
        "seconds": round(secs, 3),
        "changed": len(changed),
        "changed_after_writes": sum(1 for r in changed if r["store_changed"]),
        "unchanged": len(done) - len(changed),
        "mean_overlap": round(float(np.mean([r["overlap"] for r in done])), 4) if done else None,
        "mean_moved": round(float(np.mean([r["moved"] for r in done])), 3) if done else None,
        "changed_queries": changed,
        "latency_ms": latency(runs),
    }
