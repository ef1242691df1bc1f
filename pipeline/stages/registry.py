"""How a stage is declared: its task name, the pure function that runs it and
the per-process resources it needs, in one table, ``STAGES``.

``workers.tasks`` registers each entry as a Celery task; ``run_local`` runs
the same table in the canvas's order and shape without Celery (two legs on
their own copies of the batch, fused), so a unit test exercises the stages as
the workers chain them, with no app, broker or eager mode.

Each stage takes a ``Batch`` (``search.fuse``: the legs' batches) and the
process's ``Resources`` and returns a ``Batch``; timing is recorded by each
stage in ``QueryState.timings`` (``pipeline.timing.ms_since``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.contracts import Batch, vectors_consumed
from pipeline.embedders import Embedder
from pipeline.settings import Settings
from pipeline.stages.augment import augment_batch
from pipeline.stages.budget import budget_batch
from pipeline.stages.descend import descend_batch
from pipeline.stages.embed import embed_batch
from pipeline.stages.fulltext import fulltext_batch
from pipeline.stages.fuse import LegWeighting, fuse_batch, query_idf
from pipeline.stages.scope import scope_batch
from pipeline.store.database import created_at_of
from pipeline.store.reader import View


class Resources(Protocol):
    """What a process lends its stages; each is loaded on first use."""

    def settings(self) -> Settings: ...

    def embedder(self) -> Embedder: ...

    def view(self) -> AbstractContextManager[View | None]:
        """The published store for one stage (``pipeline.store.reader.View``: a
        cursor on the base for this thread, the deltas over it, its vector
        index), or None when nothing was written yet; closed on exit."""
        ...


@dataclass(frozen=True)
class Stage:
    """One box of the seed's pipeline: ``name`` is the task name (``search.fuse``)."""

    name: str
    run: Callable[[Any, Resources], Batch]
    fan_in: bool = False  # takes the list of the chord's leg batches


def _embed(batch: Batch, res: Resources) -> Batch:
    return embed_batch(batch, _LazyEmbedder(res))


def _descend(batch: Batch, res: Resources) -> Batch:
    with res.view() as v:
        if v is None:
            return vectors_consumed(descend_batch(batch, None, None, res.settings().tree))
        return vectors_consumed(descend_batch(batch, v.index(), v.cursor, res.settings().tree, v.overlay))


def _fulltext(batch: Batch, res: Resources) -> Batch:
    with res.view() as v:
        if v is None:
            return fulltext_batch(batch, None, res.settings().fulltext)
        return fulltext_batch(batch, v.cursor, res.settings().fulltext, v.overlay, v.postings())


def _fuse(parts: list[Batch], res: Resources) -> Batch:
    with res.view() as v:

        def created(ids: list[str]) -> dict:
            if v is None:
                return {}
            members = v.overlay.members
            out = {m: members[m].created_at for m in ids if m in members}
            rest = [m for m in ids if m not in members]
            if v.cursor is not None and rest:
                out.update(created_at_of(v.cursor, rest))
            return out

        settings = res.settings()

        def idf(text: str) -> float:
            assert v is not None  # passed to fuse_batch only with a view
            return query_idf(v.cursor, text, settings.fulltext, v.overlay, v.postings())

        return fuse_batch(parts, settings.rrf_k, created, LegWeighting.of(settings),
                          idf if v is not None and v.cursor is not None else None, settings.fts_tie_tolerance,
                          settings.fts_floor)


def _augment(batch: Batch, res: Resources) -> Batch:
    with res.view() as v:
        out = augment_batch(batch, v.cursor if v else None, res.settings().preview_chars, v.overlay if v else None)
        for state in out.states:
            state.store_version = v.overlay.version if v else None
        return out


def _scope(batch: Batch, res: Resources) -> Batch:
    return scope_batch(batch)


def _budget(batch: Batch, res: Resources) -> Batch:
    return budget_batch(batch)


class _LazyEmbedder:
    """Loads the model on the first ``embed`` call, so keyword-only batches never do."""

    def __init__(self, res: Resources):
        self._res = res

    def embed(self, texts):
        return self._res.embedder().embed(texts)


STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage("search.embed", _embed),
        Stage("search.descend", _descend),
        Stage("search.fulltext", _fulltext),
        Stage("search.fuse", _fuse, fan_in=True),
        Stage("search.augment", _augment),
        Stage("search.scope", _scope),
        Stage("search.budget", _budget),
    )
}
# The canvas: chain(chord(group(chain(embed, descend), fulltext), fuse), augment, scope, budget)
VECTOR_LEG = ("search.embed", "search.descend")
FULLTEXT_LEG = ("search.fulltext",)
FUSION = "search.fuse"
AFTER_FUSION = ("search.augment", "search.scope", "search.budget")


def run_local(batch: Batch, res: Resources) -> Batch:
    """The query canvas in this process, without Celery: each leg gets its own
    copy of the batch, as each gets its own message on the workers."""
    legs = []
    for leg in (VECTOR_LEG, FULLTEXT_LEG):
        part = batch.model_copy(deep=True)
        for name in leg:
            part = STAGES[name].run(part, res)
        legs.append(part)
    out = STAGES[FUSION].run(legs, res)
    for name in AFTER_FUSION:
        out = STAGES[name].run(out, res)
    return out


