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
from pipeline.stages.supersede import ordered, walk_successors
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


class Graph:
    """The memories and typed edges one ``search.augment`` call reads, read on
    demand (``load``) from the base and the deltas over it: a memory a delta
    replaced or forgot is never read from the base, and a forgotten one is in
    neither ``rows`` nor any link."""

    def __init__(self, con, overlay: Overlay | None = None):
        self.con = con
        self.live = overlay if overlay is not None and not overlay.empty else None
        self.rows: dict[str, tuple] = {}  # id -> (id, namespace, content_type, created_at, content)
        self.topics: dict[str, list[str]] = defaultdict(list)
        self.concepts: dict[str, list[str]] = defaultdict(list)
        self.links: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self._edges_read: set[str] = set()
        self._rows_read: set[str] = set()

    def loaded(self, mid: str) -> bool:
        """Whether ``mid``'s edges (so its whole graph context) have been read."""
        return mid in self._edges_read

    def load(self, ids) -> None:
        """Read the edges touching ``ids`` and the memories at both ends."""
        new = sorted(set(ids) - self._edges_read)
        if new:
            self._edges_read.update(new)
            edges = rows_by_ids(self.con, _EDGES, new) if self.live is None else _live_edges(self.con, new, self.live)
            for src, dst, kind in edges:
                if kind == "supersedes":
                    self.links[dst]["superseded_by"].add(src)
                elif kind == "supports":
                    self.links[dst]["supported_by"].add(src)
                elif kind == "conflicts":
                    self.links[dst]["conflicts"].add(src)
                    self.links[src]["conflicts"].add(dst)
        linked = {m for i in new for group in self.links.get(i, {}).values() for m in group}
        self._read_rows(set(new) | linked)

    def _read_rows(self, ids: set[str]) -> None:
        new = sorted(ids - self._rows_read)
        if not new:
            return
        self._rows_read.update(new)
        live = self.live
        from_base = new if live is None else [m for m in new if m not in live.touched]
        if from_base and self.con is not None:
            self.rows.update((r[0], r) for r in rows_by_ids(self.con, _ROWS, from_base))
            for mid, key in rows_by_ids(self.con, _TOPICS, from_base):
                self.topics[mid].append(key)
            for mid, concept in rows_by_ids(self.con, _CONCEPTS, from_base):
                self.concepts[mid].append(concept)
        if live is not None:
            for mid in new:
                m = live.members.get(mid)
                if m is not None:
                    self.rows[mid] = (mid, m.namespace, m.content_type, m.created_at, m.content)
                    self.topics[mid] = m.all_topics
                    self.concepts[mid] = sorted(m.concepts)

    def superseded_by(self, mid: str) -> list[str]:
        """The live memories that supersede ``mid`` (its edges must be loaded)."""
        return sorted(m for m in self.links.get(mid, {}).get("superseded_by", ()) if m in self.rows)

    def created_at(self, mid: str):
        return self.rows[mid][3]

    def link(self, mid: str, preview_chars: int) -> GraphLink:
        _, ns, ctype, _, content = self.rows[mid]
        return GraphLink(
            id=mid, preview=preview(content, preview_chars), namespace=ns, content_type=ctype,
            topics=sorted(set(self.topics[mid])), concepts=self.concepts[mid],
        )


def augment_batch(batch: Batch, con, preview_chars: int, overlay: Overlay | None = None) -> Batch:
    """The ``search.augment`` stage: fused candidates become results with graph context.

    With deltas (``overlay``), delta memories are read from it and memories a
    delta replaced or forgot are never read from the base: a forgotten memory
    appears neither as a result nor in a link. Each query's ``supersession``
    (``pipeline.stages.supersede``) then decides where a superseded result's
    newest in-scope successor goes, before the budget's cap below.
    """
    t0 = time.perf_counter()
    wanted = sorted({f.id for s in batch.states for f in s.fused})
    if not wanted:
        for state in batch.states:
            state.results = []
            state.timings["augment"] = ms_since(t0)
        return batch
    graph = Graph(con, overlay)
    graph.load(wanted)
    walk_successors(graph, batch.states, preview_chars)

    def link(mid: str) -> GraphLink:
        return graph.link(mid, preview_chars)

    for state in batch.states:
        results: list[Result] = []
        # The budget keeps at most max_units of the results the scope stage
        # lets through: in-scope candidates past those are only counted (the
        # budget reports them as left out), not carried with content and
        # graph context through scope and budget. Out-of-scope ones still go
        # to the scope stage, which drops and counts them. Promoted successors
        # are in scope and count like any result: budgets apply after promotion.
        scope, cap = state.query.scope, state.query.budget.max_units
        kept_in_scope = 0
        fused_of = {f.id: f for f in state.fused}
        for mid, above in ordered(graph, state, preview_chars):
            inside = in_scope(link(mid), scope)
            if cap is not None and kept_in_scope >= cap and inside:
                state.beyond_budget += 1
                continue
            kept_in_scope += inside
            fused = fused_of.get(mid)
            _, ns, ctype, created, content = graph.rows[mid]
            per = graph.links.get(mid, {})
            results.append(
                Result(
                    rank=len(results) + 1, id=mid, score=fused.score if fused else 0.0, rrf=fused.rrf if fused else 0.0,
                    recency_factor=fused.recency_factor if fused else None, ranks=fused.ranks if fused else {},
                    tied_ranks=fused.tied_ranks if fused else {},
                    namespace=ns, content_type=ctype, created_at=created, content=content,
                    preview=preview(content, preview_chars),
                    topics=sorted(set(graph.topics[mid])), concepts=graph.concepts[mid],
                    superseded_by=[link(m) for m in sorted(per.get("superseded_by", ())) if m in graph.rows],
                    conflicts=[link(m) for m in sorted(per.get("conflicts", ())) if m in graph.rows],
                    supported_by=[link(m) for m in sorted(per.get("supported_by", ())) if m in graph.rows],
                    promoted_above=above,
                )
            )
        state.results = results
        state.fused = []
        state.timings["augment"] = ms_since(t0)
    return batch
