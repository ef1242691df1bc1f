"""Supersession-aware ranking: what a query does with a result that a newer
memory supersedes (``QueryOptions.supersession``), run inside ``search.augment``
(``pipeline.stages.augment``) before the budget's cap, so budgets apply after it.

- ``annotate``: the results as fused; a superseded one carries its
  ``superseded_by`` links (the graph context) and nothing moves.
- ``promote``: a superseded result's successor (the memory that supersedes
  it, followed along the chain to the newest one) is placed directly above
  it, read from the store when it was not a candidate, and moved up when it
  was; the superseded result stays, with its marker. The successor carries
  ``promoted_above`` (the superseded result's id) and, when it was not a
  candidate, no leg ranks and a score of 0.
- ``hide``: as promote, and the superseded result is dropped and counted
  (``hidden_superseded``): its successor takes its place.

Only live, in-scope memories are successors: the chain is followed through
memories inside the query's scope only, a memory outside it is never read as a
result, loaded for its own links or revealed, and a forgotten memory (a
delta's tombstone) is in no row and no edge. A superseded result whose every
successor is outside the scope (or forgotten) stays as in ``annotate``. When a
chain branches, every newest successor is promoted, newest first.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Protocol

from pipeline.contracts import QueryState, Scope, Supersession
from pipeline.stages.scope import Scoped, in_scope


class Graph(Protocol):
    """What this needs of ``pipeline.stages.augment.Graph``: live memories
    (``rows``), their supersession links, and loading more of them."""

    rows: dict[str, tuple]

    def loaded(self, mid: str) -> bool: ...

    def load(self, ids: Iterable[str]) -> None: ...

    def superseded_by(self, mid: str) -> list[str]: ...

    def created_at(self, mid: str) -> datetime: ...

    def facets(self, mid: str) -> Scoped: ...

# How many links of a chain are followed at most (each is one small read per batch).
MAX_CHAIN = 64


def _wants(state: QueryState) -> bool:
    return state.query.options.supersession is not Supersession.annotate


def _successors(graph: Graph, mid: str, scope: Scope) -> list[str]:
    """The live memories inside ``scope`` that supersede ``mid``."""
    return [s for s in graph.superseded_by(mid) if in_scope(graph.facets(s), scope)]


def _superseded(graph: Graph, state: QueryState) -> list[str]:
    """The query's live, in-scope candidates that something live supersedes."""
    scope = state.query.scope
    return [f.id for f in state.fused if f.id in graph.rows and graph.superseded_by(f.id)
            and in_scope(graph.facets(f.id), scope)]


def walk_successors(graph: Graph, states: list[QueryState]) -> None:
    """Load the supersession chains of every promote/hide query's superseded
    candidates, one level per round for the whole batch, through in-scope
    memories only."""
    active = [(s, _superseded(graph, s)) for s in states if _wants(s)]
    active = [(s, starts) for s, starts in active if starts]
    for _ in range(MAX_CHAIN):
        need: set[str] = set()
        for state, starts in active:
            scope = state.query.scope
            seen: set[str] = set()
            stack = list(starts)
            while stack:
                mid = stack.pop()
                if mid in seen:
                    continue
                seen.add(mid)
                if not graph.loaded(mid):
                    need.add(mid)
                    continue
                stack.extend(_successors(graph, mid, scope))
        if not need:
            return
        graph.load(need)


def newest_successors(graph: Graph, mid: str, scope: Scope) -> list[str]:
    """The ends of ``mid``'s in-scope supersession chain(s), newest first:
    the in-scope successors reachable from it that nothing in scope supersedes
    (in a cycle, the newest memory on it)."""
    reached: list[str] = []
    seen, stack = {mid}, [mid]
    while stack:
        for s in _successors(graph, stack.pop(), scope):
            if s not in seen:
                seen.add(s)
                reached.append(s)
                if graph.loaded(s):
                    stack.append(s)
    ends = [s for s in reached if not (graph.loaded(s) and _successors(graph, s, scope))]
    if not ends and reached:  # a cycle: its newest memory, ``mid`` itself when on it (nothing newer supersedes it)
        on_it = any(mid in _successors(graph, s, scope) for s in reached if graph.loaded(s))
        newest = max([*reached, *([mid] if on_it else [])], key=lambda s: (graph.created_at(s), s))
        ends = [] if newest == mid else [newest]
    return sorted(ends, key=lambda s: (graph.created_at(s), s), reverse=True)


def ordered(graph: Graph, state: QueryState) -> list[tuple[str, str | None]]:
    """The query's live candidates in the order its ``supersession`` serves
    them, as ``(id, promoted_above)``; counts what ``hide`` drops in
    ``state.hidden_superseded``."""
    live = [f.id for f in state.fused if f.id in graph.rows]  # not: deleted since the legs ran
    if not _wants(state):
        return [(m, None) for m in live]
    hide = state.query.options.supersession is Supersession.hide
    scope = state.query.scope
    superseded = set(_superseded(graph, state))
    out: list[tuple[str, str | None]] = []
    placed: set[str] = set()
    for mid in live:
        ends = newest_successors(graph, mid, scope) if mid in superseded else []
        for s in ends:
            if s not in placed:
                out.append((s, mid))
                placed.add(s)
        if ends and hide:
            state.hidden_superseded += 1
            continue
        if mid not in placed:
            out.append((mid, None))
            placed.add(mid)
    return out
