"""Scoping: namespace, topics (membership, ancestors included), content type
and concepts.

The same scope is pushed into both legs before their top-k
(``pipeline.store.fulltext`` as masks or in SQL, ``pipeline.store.vector`` as a row
mask and a restricted descent); this stage holds it again after augmentation, so no
result and no graph context outside the scope ever leaves the pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from pipeline.contracts import Batch, Result, Scope
from pipeline.stages.stage import Resources, Stage
from pipeline.timing import ms_since


class Scoped(Protocol):
    """What the scope looks at: a ``Result``, a ``GraphLink``, or a memory as
    ``search.augment`` reads it (``pipeline.stages.augment.Facets``)."""

    @property
    def namespace(self) -> str: ...

    @property
    def content_type(self) -> str: ...

    @property
    def topics(self) -> Sequence[str]: ...

    @property
    def concepts(self) -> Sequence[str]: ...


def in_scope(item: Scoped, scope: Scope) -> bool:
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
        scope = state.query.scope
        kept: list[Result] = []
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
        state.timings["scope"] = ms_since(t0)
    return batch


def run(batch: Batch, res: Resources) -> Batch:
    return scope_batch(batch)


STAGE = Stage("search.scope", run)
