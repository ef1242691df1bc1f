"""The vector leg (``search.descend``): the seed's beam descent for every
query of a batch, over the base's vector index and the deltas over it
(``pipeline.store.vector``, where the index, the descent and its loops live).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from pipeline.contracts import Batch, Hit, LegRun, vectors_consumed
from pipeline.embedders import check_model
from pipeline.errors import InputError
from pipeline.settings import TreeSettings
from pipeline.stages.stage import Resources, Stage
from pipeline.store.overlay import Overlay
from pipeline.store.vector import VectorIndex, delta_hits, descend
from pipeline.timing import ms_since


def descend_batch(batch: Batch, index: VectorIndex | None, con, tree: TreeSettings,
                  overlay: Overlay | None = None, trace: dict[str, list] | None = None,
                  model: str | None = None) -> Batch:
    """The ``search.descend`` stage: the vector leg for every query of a batch.

    With deltas (``overlay``) the base's beam descent skips dead rows and the
    live delta memories in scope are scored exactly; one ranking, ties by id.
    ``trace`` (a dict) gets each query's beam, depth by depth, under its id
    (``pipeline.store.vector.descend``'s ``trace``). ``model``: the one the
    store recorded; a query vector embedded by another is refused
    (``check_model``), as is one of another dimension.
    """
    live = overlay is not None and not overlay.empty
    for state in batch.states:
        q = state.query
        if "vector" in state.legs:  # already decided upstream (deadline)
            continue
        if not q.wants("vector"):
            state.legs["vector"] = LegRun(leg="vector", ran=False)
            continue
        t0 = time.perf_counter()
        hits: list[tuple[str, float]]
        profile: dict[str, Any]
        if q.vector is not None and q.embedded_by is not None and model is not None and index is not None:
            check_model(model, index.emb.shape[1], q.embedded_by, len(q.vector), "the store")
        if q.vector is not None and index is not None and len(q.vector) != index.emb.shape[1]:
            raise InputError("vector", f"{len(q.vector)} dimensions; the store's embeddings have {index.emb.shape[1]}")
        if index is None or index.size == 0 or q.vector is None:
            hits, profile = [], {"topics_scored": 0, "leaves_reached": 0, "memories_scored": 0, "timed_out": False}
        else:
            scope = q.scope
            hits, profile = descend(
                index,
                np.asarray(q.vector, dtype=np.float32),
                index.start_topics(scope),
                beam_width=tree.beam_width,
                max_depth=tree.max_depth,
                top_k=q.top_k,
                mask=index.row_mask(con, scope),
                deadline=q.deadline,
                exclude=overlay.dead_rows(index) if live and overlay is not None else None,
                trace=trace.setdefault(q.id, []) if trace is not None else None,
            )
        if live and overlay is not None and q.vector is not None and not profile.get("timed_out", False):
            extra = delta_hits(overlay, np.asarray(q.vector, dtype=np.float32), q.scope, q.top_k)
            profile["delta_memories_scored"] = len(overlay.ids)
            hits = sorted(hits + extra, key=lambda h: (-h[1], h[0]))[: q.top_k]
        state.legs["vector"] = LegRun(
            leg="vector",
            ran=not profile.get("timed_out", False),
            hits=[Hit(id=m, score=s, rank=r) for r, (m, s) in enumerate(hits, start=1)],
            profile=profile,
        )
        state.timings["descend"] = ms_since(t0)
    return batch


def run(batch: Batch, res: Resources, trace: dict[str, list] | None = None) -> Batch:
    """``descend_batch`` over the published store; ``trace``: as there."""
    with res.view() as v:
        if v is None:
            return vectors_consumed(descend_batch(batch, None, None, res.settings().tree))
        return vectors_consumed(descend_batch(batch, v.index(), v.cursor, res.settings().tree, v.overlay, trace,
                                              v.model))


STAGE = Stage("search.descend", run)
