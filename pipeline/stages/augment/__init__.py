"""The ``search.augment`` stage, graph augmentation: each result gets its
context from the typed edges (read by ``pipeline.store.graph``), and each
query's supersession (``supersede``, a helper of this stage) is applied.

supersededBy = memories that supersede it (reverse of ``supersedes``),
conflicts = either side of a ``conflicts`` edge, supportedBy = memories that
support it. Links carry a short preview and the attributes the scope stage
needs to hold the scope over them too.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from pipeline.contracts import Batch, GraphLink, Result
from pipeline.stages.augment.supersede import ordered, walk_successors
from pipeline.stages.scope import in_scope
from pipeline.stages.stage import Resources, Stage
from pipeline.store.graph import BaseGraph
from pipeline.store.graph import Graph as StoreGraph
from pipeline.store.overlay import Overlay
from pipeline.timing import ms_since


def preview(text: str, width: int) -> str:
    """First ``width`` characters of ``text`` on one line, with an ellipsis when cut."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


class Facets(NamedTuple):
    """A memory as the scope sees it (``pipeline.stages.scope.Scoped``), with
    the topics and concepts every result and link of it shows."""

    namespace: str
    content_type: str
    topics: list[str]  # sorted, unique
    concepts: list[str]


class Graph(StoreGraph):
    """The store's graph read (``pipeline.store.graph``), with the links a
    result shows (``pipeline.stages.augment.supersede`` reads it through its ``Graph``).
    Each memory's facets and preview are worked out once per call, however
    many results and links show it."""

    def __init__(self, con, overlay: Overlay | None = None, base: BaseGraph | None = None):
        super().__init__(con, overlay, base)
        self._facets: dict[str, Facets] = {}
        self._previews: dict[tuple[str, int], str] = {}

    def facets(self, mid: str) -> Facets:
        """``mid``'s namespace, type, topics and concepts (it must be in ``rows``)."""
        out = self._facets.get(mid)
        if out is None:
            _, ns, ctype, _, _ = self.rows[mid]
            out = self._facets[mid] = Facets(ns, ctype, sorted(set(self.topics[mid])), list(self.concepts[mid]))
        return out

    def preview(self, mid: str, width: int) -> str:
        out = self._previews.get((mid, width))
        if out is None:
            out = self._previews[(mid, width)] = preview(self.rows[mid][4], width)
        return out

    def link(self, mid: str, preview_chars: int) -> GraphLink:
        f = self.facets(mid)
        return GraphLink(id=mid, preview=self.preview(mid, preview_chars), namespace=f.namespace,
                         content_type=f.content_type, topics=list(f.topics), concepts=list(f.concepts))


def augment_batch(batch: Batch, con, preview_chars: int, overlay: Overlay | None = None,
                  base: BaseGraph | None = None) -> Batch:
    """The ``search.augment`` stage: fused candidates become results with graph context.

    With deltas (``overlay``), delta memories are read from it and memories a
    delta replaced or forgot are never read from the base: a forgotten memory
    appears neither as a result nor in a link. Each query's ``supersession``
    (``pipeline.stages.augment.supersede``) then decides where a superseded result's
    newest in-scope successor goes, before the budget's cap below. ``base``
    keeps what was read of the base for later calls (``View.graph``); without
    it everything is read afresh.
    """
    t0 = time.perf_counter()
    wanted = sorted({f.id for s in batch.states for f in s.fused})
    if not wanted:
        for state in batch.states:
            state.results = []
            state.timings["augment"] = ms_since(t0)
        return batch
    graph = Graph(con, overlay, base)
    graph.load(wanted)
    walk_successors(graph, batch.states)

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
        kept_in_scope = beyond = 0
        fused_of = {f.id: f for f in state.fused}
        for mid, above in ordered(graph, state):
            facets = graph.facets(mid)
            inside = in_scope(facets, scope)
            if cap is not None and kept_in_scope >= cap and inside:
                beyond += 1  # counted here, set once below (a model's setattr costs ~1 us)
                continue
            kept_in_scope += inside
            fused = fused_of.get(mid)
            _, ns, ctype, created, content = graph.rows[mid]
            per = graph.links.get(mid, {})
            results.append(
                Result(
                    rank=len(results) + 1, id=mid, score=fused.score if fused else 0.0, rrf=fused.rrf if fused else 0.0,
                    recency_factor=fused.recency_factor if fused else None, ranks=fused.ranks if fused else {},
                    namespace=ns, content_type=ctype, created_at=created, content=content,
                    preview=graph.preview(mid, preview_chars),
                    topics=list(facets.topics), concepts=list(facets.concepts),
                    superseded_by=[link(m) for m in sorted(per.get("superseded_by", ())) if m in graph.rows],
                    conflicts=[link(m) for m in sorted(per.get("conflicts", ())) if m in graph.rows],
                    supported_by=[link(m) for m in sorted(per.get("supported_by", ())) if m in graph.rows],
                    promoted_above=above,
                )
            )
        state.results = results
        state.beyond_budget += beyond
        state.fused = []
        state.timings["augment"] = ms_since(t0)
    return batch


def run(batch: Batch, res: Resources) -> Batch:
    with res.view() as v:
        out = augment_batch(batch, v.cursor if v else None, res.settings().preview_chars, v.overlay if v else None,
                            v.graph if v else None)
        for state in out.states:
            state.store_version = v.overlay.version if v else None
        return out


STAGE = Stage("search.augment", run)
