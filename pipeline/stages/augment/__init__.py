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

from pipeline.contracts import Batch, GraphLink, Result
from pipeline.stages.augment.supersede import ordered, walk_successors
from pipeline.stages.scope import in_scope
from pipeline.stages.stage import Resources, Stage
from pipeline.store.graph import Graph as StoreGraph
from pipeline.store.overlay import Overlay
from pipeline.timing import ms_since


def preview(text: str, width: int) -> str:
    """First ``width`` characters of ``text`` on one line, with an ellipsis when cut."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"


class Graph(StoreGraph):
    """The store's graph read (``pipeline.store.graph``), with the links a
    result shows (``pipeline.stages.augment.supersede`` reads it through its ``Graph``)."""

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
    (``pipeline.stages.augment.supersede``) then decides where a superseded result's
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


def run(batch: Batch, res: Resources) -> Batch:
    with res.view() as v:
        out = augment_batch(batch, v.cursor if v else None, res.settings().preview_chars, v.overlay if v else None)
        for state in out.states:
            state.store_version = v.overlay.version if v else None
        return out


STAGE = Stage("search.augment", run)
