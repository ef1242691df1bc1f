"""Graph augmentation: each result gets its context from the typed edges.

supersededBy = memories that supersede it (reverse of ``supersedes``),
conflicts = either side of a ``conflicts`` edge, supportedBy = memories that
support it. Links carry a short preview and the attributes the scope stage
needs to hold the scope over them too.
"""

from __future__ import annotations

import time
from collections import defaultdict

from pipeline.contracts import Batch, GraphLink, Result
from pipeline.stages.scope import in_scope
from pipeline.store.database import rows_by_ids
from pipeline.store.overlay import Overlay
from pipeline.timing import ms_since

# {id}, {memory_id}, {src}, {dst}: "that column is one of the ids", from
# pipeline.store.database.rows_by_ids (index lookups for one query's candidates).
_ROWS = "SELECT id, namespace, content_type, created_at, content FROM memories WHERE {id}"
_TOPICS = "SELECT memory_id, topic_key FROM memory_topics WHERE {memory_id} ORDER BY 1, 2"
_CONCEPTS = "SELECT memory_id, concept FROM memory_concepts WHERE {memory_id} ORDER BY 1, 2"
_EDGES = "SELECT DISTINCT src, dst, kind FROM edges WHERE {dst} OR (kind = 'conflicts' AND {src}) ORDER BY 1, 2, 3"
# with deltas: the declaring memory too, since a delta voids the edges its memories declared in the base
_EDGES_BY_ORIGIN = "SELECT DISTINCT src, dst, kind, origin FROM edges WHERE {dst} OR (kind = 'conflicts' AND {src})"


def preview(text: str, width: int) -> str:
    """First ``width`` characters of ``text`` on one line, with an ellipsis when cut."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


def _live_edges(con, wanted: list[str], overlay: Overlay) -> list[tuple[str, str, str]]:
    """Edges touching ``wanted``: the base's, less those a delta voided (their
    declaring memory was rewritten or forgotten), plus those delta memories declare."""
    base = [(s, d, k) for s, d, k, origin in rows_by_ids(con, _EDGES_BY_ORIGIN, wanted) if origin not in overlay.touched]
    want = set(wanted)
    delta = [
        (s, d, k) for m in overlay.members.values() for s, d, k in m.edges()
        if d in want or (k == "conflicts" and s in want)
    ]
    return sorted(set(base) | set(delta))


def augment_batch(batch: Batch, con, preview_chars: int, overlay: Overlay | None = None) -> Batch:
    """The ``search.augment`` stage: fused candidates become results with graph context.

    With deltas (``overlay``), delta memories are read from it and memories a
    delta replaced or forgot are never read from the base: a forgotten memory
    appears neither as a result nor in a link.
    """
    t0 = time.perf_counter()
    wanted = sorted({f.id for s in batch.states for f in s.fused})
    if not wanted:
        for state in batch.states:
            state.results = []
            state.timings["augment"] = ms_since(t0)
        return batch
    live = overlay if overlay is not None and not overlay.empty else None
    edges = rows_by_ids(con, _EDGES, wanted) if live is None else _live_edges(con, wanted, live)
    links: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for src, dst, kind in edges:
        if kind == "supersedes":
            links[dst]["superseded_by"].add(src)
        elif kind == "supports":
            links[dst]["supported_by"].add(src)
        elif kind == "conflicts":
            links[dst]["conflicts"].add(src)
            links[src]["conflicts"].add(dst)
    linked = {m for per in links.values() for group in per.values() for m in group}
    everything = sorted(set(wanted) | linked)
    from_base = everything if live is None else [m for m in everything if m not in live.touched]
    rows = {r[0]: r for r in rows_by_ids(con, _ROWS, from_base)} if from_base else {}
    topics: dict[str, list[str]] = defaultdict(list)
    concepts: dict[str, list[str]] = defaultdict(list)
    if from_base:
        for mid, key in rows_by_ids(con, _TOPICS, from_base):
            topics[mid].append(key)
        for mid, concept in rows_by_ids(con, _CONCEPTS, from_base):
            concepts[mid].append(concept)
    if live is not None:
        for mid in everything:
            m = live.members.get(mid)
            if m is not None:
                rows[mid] = (mid, m.namespace, m.content_type, m.created_at, m.content)
                topics[mid] = m.all_topics
                concepts[mid] = sorted(m.concepts)

    def link(mid: str) -> GraphLink:
        _, ns, ctype, _, content = rows[mid]
        return GraphLink(
            id=mid, preview=preview(content, preview_chars), namespace=ns, content_type=ctype,
            topics=sorted(set(topics[mid])), concepts=concepts[mid],
        )

    for state in batch.states:
        results: list[Result] = []
        # The budget keeps at most max_units of the results the scope stage
        # lets through: in-scope candidates past those are only counted (the
        # budget reports them as left out), not carried with content and
        # graph context through scope and budget. Out-of-scope ones still go
        # to the scope stage, which drops and counts them.
        scope, cap = state.query.scope, state.query.budget.max_units
        kept_in_scope = 0
        for fused in state.fused:
            if fused.id not in rows:  # deleted since the legs ran
                continue
            inside = in_scope(link(fused.id), scope)
            if cap is not None and kept_in_scope >= cap and inside:
                state.beyond_budget += 1
                continue
            kept_in_scope += inside
            _, ns, ctype, created, content = rows[fused.id]
            per = links.get(fused.id, {})
            results.append(
                Result(
                    rank=len(results) + 1, id=fused.id, score=fused.score, rrf=fused.rrf,
                    recency_factor=fused.recency_factor, ranks=fused.ranks,
                    namespace=ns, content_type=ctype, created_at=created, content=content,
                    preview=preview(content, preview_chars),
                    topics=sorted(set(topics[fused.id])), concepts=concepts[fused.id],
                    superseded_by=[link(m) for m in sorted(per.get("superseded_by", ())) if m in rows],
                    conflicts=[link(m) for m in sorted(per.get("conflicts", ())) if m in rows],
                    supported_by=[link(m) for m in sorted(per.get("supported_by", ())) if m in rows],
                )
            )
        state.results = results
        state.fused = []
        state.timings["augment"] = ms_since(t0)
    return batch
