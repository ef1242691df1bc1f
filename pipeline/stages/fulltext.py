"""The full-text leg (``search.fulltext``): BM25 for every query of a batch
that wants it, over the base and its deltas (``pipeline.store.fulltext``,
where the formula, the terms, the postings and the search live).
"""

from __future__ import annotations

import time

from pipeline.contracts import Batch, Hit, LegRun
from pipeline.settings import FulltextSettings
from pipeline.stages.stage import Resources, Stage
from pipeline.store.fulltext import Postings, index_exists, search_until
from pipeline.store.overlay import Overlay
from pipeline.timing import ms_since


def fulltext_batch(batch: Batch, con, settings: FulltextSettings, overlay: Overlay | None = None,
                   postings: Postings | None = None) -> Batch:
    """The ``search.fulltext`` stage: BM25 for every query of a batch that wants it,
    over the base read through ``con`` (its ``postings`` in memory, when
    loaded) and the deltas of ``overlay``."""
    has_index = postings is not None or (con is not None and index_exists(con))
    for state in batch.states:
        q = state.query
        if not q.wants("fts"):
            state.legs["fts"] = LegRun(leg="fts", ran=False)
            continue
        t0 = time.perf_counter()
        if has_index:
            hits, timed_out = search_until(con, q.text, q.scope, q.top_k, settings, q.deadline, overlay, postings)
        else:
            hits, timed_out = [], False
        ms = ms_since(t0)
        state.legs["fts"] = LegRun(
            leg="fts",
            ran=not timed_out,
            hits=[Hit(id=m, score=s, rank=r) for r, (m, s) in enumerate(hits, start=1)],
            profile={"matched": len(hits), "timed_out": timed_out, "ms": ms},
        )
        state.timings["fulltext"] = ms
    return batch


def run(batch: Batch, res: Resources) -> Batch:
    with res.view() as v:
        if v is None:
            return fulltext_batch(batch, None, res.settings().fulltext)
        return fulltext_batch(batch, v.cursor, res.settings().fulltext, v.overlay, v.postings())


STAGE = Stage("search.fulltext", run)
