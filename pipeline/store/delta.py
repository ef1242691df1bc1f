"""A write's memories as a delta carries them: tokenized for BM25 by the FTS
extension itself and routed to the base's tree. Used by the write path
(``pipeline.store.writes.prepare``) and by the lake's deltas
(``pipeline.store.lake.derive``), so both hold what a compacted base would."""

from __future__ import annotations

from datetime import datetime

import numpy as np

from pipeline.settings import Settings
from pipeline.store.fulltext import tokenize
from pipeline.store.ingest import MemoryRecord, content_hash, fts_text, record_id
from pipeline.store.overlay import DeltaMemory
from pipeline.store.vector import TreeRouter


def delta_memories(records: list[MemoryRecord], created: list[datetime], vectors: np.ndarray, settings: Settings,
                   router: TreeRouter | None, *, for_delta: bool = True) -> list[DeltaMemory]:
    """``records`` (with their ``created_at`` and embeddings, row by row) as a
    delta's memories: tokenized for BM25 by the FTS extension itself and routed
    to the nearest leaf of the base's tree (``router``; None: no base). A write
    going straight into a base (not ``for_delta``) needs neither: compaction
    indexes and places it."""
    terms = tokenize([fts_text(r) for r in records], settings.fulltext) if for_delta else [(0, {}) for _ in records]
    out = []
    for i, r in enumerate(records):
        length, counts = terms[i]
        out.append(DeltaMemory(
            id=record_id(r), namespace=r.namespace, content=r.content, content_type=r.content_type,
            created_at=created[i], context=r.context, metadata=r.metadata, content_hash=content_hash(r.content),
            topics=list(r.topics), concepts=list(r.concepts), supersedes=list(r.supersedes),
            conflicts=list(r.conflicts), supported_by=list(r.supported_by),
            tree=router.route(r.namespace, vectors[i]) if router is not None else [],
            fts_len=length, terms=counts,
        ))
    return out
