"""The ``search.embed`` stage: one batched encode for the queries of a batch
that need a vector.
"""

from __future__ import annotations

import time

from pipeline.contracts import Batch, LegRun
from pipeline.embedders import Encoder
from pipeline.identity import vector_identity
from pipeline.stages.stage import Resources, Stage
from pipeline.timing import ms_since


def embed_batch(batch: Batch, embedder: Encoder) -> Batch:
    """The ``search.embed`` stage: one batched encode for every query that needs a vector.

    Keyword-mode queries (vector weight 0) are skipped; a query already past
    its deadline gets no vector and its vector leg reports the timeout.
    """
    t0 = time.perf_counter()
    todo = []
    for state in batch.states:
        q = state.query
        if not q.wants("vector") or q.vector is not None:
            continue
        if q.past_deadline():
            state.legs["vector"] = LegRun(leg="vector", ran=False, profile={"timed_out": True})
            continue
        todo.append(state)
    if todo:
        vectors = embedder.embed([s.query.text for s in todo])
        model = getattr(embedder, "name", None)
        for state, vec in zip(todo, vectors):
            state.query.vector = vec.tolist()
            state.query.embedded_by = model
            if not state.query.wants("fts"):  # semantic: the vector is the query's identity
                state.query.identity = vector_identity(vec)
                state.query.identity_of = "vector"
    ms = ms_since(t0)
    for state in todo:
        state.timings["embed"] = ms
    return batch


def run(batch: Batch, res: Resources) -> Batch:
    return embed_batch(batch, _LazyEmbedder(res))


class _LazyEmbedder:
    """Loads the model on the first ``embed`` call, so keyword-only batches never do."""

    def __init__(self, res: Resources):
        self._res = res

    @property
    def name(self) -> str:
        return self._res.embedder().name

    def embed(self, texts):
        return self._res.embedder().embed(texts)


STAGE = Stage("search.embed", run)
