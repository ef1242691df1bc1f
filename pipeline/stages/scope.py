"""Scoping: namespace, topics (membership, ancestors included), content type
and concepts.

The same scope is pushed into both legs before their top-k
(``pipeline.fulltext`` in SQL, ``pipeline.vector`` as a row mask and a
restricted descent); this stage holds it again after augmentation, so no
result and no graph context outside the scope ever leaves the pipeline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pipeline.contracts import Batch, GraphLink, Query, Result


@dataclass(frozen=True)
class Scope:
    """Filters pushed into a leg before its top-k (empty = no filter)."""

    namespace: str | None = None
    topics: tuple[str, ...] = ()
    content_types: tuple[str, ...] = ()
    concepts: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.namespace or self.topics or self.content_types or self.concepts)


def scope_of(query: Query) -> Scope:
    o = query.options
    return Scope(
        namespace=o.namespace,
        topics=tuple(o.topics),
        content_types=tuple(o.content_type),
        concepts=tuple(o.concepts),
    )


def in_scope(item: Result | GraphLink, scope: Scope) -> bool:
    if scope.namespace is not None and item.namespace != scope.namespace:
        return False
    if scope.content_types and item.content_type not in scope.content_types:
        return False
    if scope.topics and not set(scope.topics) & set(item.topics):
        return False
    if scope.concepts and not set(scope.concepts) & set(item.concepts):
        return False
    return True


def scope_batch(batch: Batch) -> Batch:
    """The ``search.scope`` stage: drop results and links outside each query's scope."""
    for state in batch.states:
        t0 = time.perf_counter()
        scope = scope_of(state.query)
        kept = []
        for result in state.results:
            if not in_scope(result, scope):
                state.scope_dropped += 1
                continue
            result.superseded_by = [l for l in result.superseded_by if in_scope(l, scope)]
            result.conflicts = [l for l in result.conflicts if in_scope(l, scope)]
            result.supported_by = [l for l in result.supported_by if in_scope(l, scope)]
            result.rank = len(kept) + 1
            kept.append(result)
        state.results = kept
        state.timings["scope"] = round((time.perf_counter() - t0) * 1000, 3)
    return batch
