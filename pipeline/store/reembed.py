"""``dimple reembed``: every live memory embedded again by the configured model, into a new base.

A store holds one model's vectors (``pipeline.embedders.check_model``); this
is how it moves to another. The new base records the new model and dimension,
its topic tree is clustered afresh, and it is published in place of the old
base and its deltas, as a compaction publishes (a reader goes on answering
from the old base until the new one is loaded). Writes wait while it runs
(it holds the write lock: a write embedded by either model in between would
be lost or mixed), up to ``write_wait_s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pipeline.embedders import Embedder, make_embedder
from pipeline.errors import StoreError
from pipeline.settings import Settings
from pipeline.store import segments
from pipeline.store.compact import fresh_base
from pipeline.store.ingest import MemoryRecord, _embed_batched, embedding_text, record_id
from pipeline.store.reader import Reader
from pipeline.store.writes import get


@dataclass
class ReembedReport:
    version: int
    memories: int
    model: str
    dim: int
    previous: tuple[str, int]  # the model and dimension the store held before
    removed: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def reembed(settings: Settings, *, embedder: Embedder | None = None, progress: bool = False) -> ReembedReport:
    """Embed every live memory of ``settings.data_dir`` with ``embedder`` (default:
    the configured model's bulk embedder) into a new base and publish it."""
    if settings.store.engine == "lake":
        raise StoreError("store.engine: 'dimple reembed' of the lake is not built yet (docs/LAKE.md); "
                         "it re-embeds the segment store")
    t0 = time.perf_counter()
    data_dir = settings.data_dir
    embedder = embedder or make_embedder(settings, bulk=True)
    reader = Reader(data_dir)
    try:
        with segments.compact_lock(data_dir, wait=True), segments.write_lock(data_dir, wait_s=settings.write_wait_s):
            start = segments.read_manifest(data_dir)
            snap = reader.snapshot()
            if start is None or start.base is None or snap is None or snap.store is None:
                raise StoreError(f"no store in {data_dir} to re-embed")
            previous = (snap.store.info.embedding_model, snap.store.info.embedding_dim)
            base_ids = [r[0] for r in snap.store.con.execute("SELECT id FROM memories ORDER BY id").fetchall()]
            overlay = snap.overlay
            ids = sorted({m for m in base_ids if m not in overlay.touched} | set(overlay.members))
            records = [MemoryRecord.model_validate(r) for r in get(settings, ids, reader)]
            t1 = time.perf_counter()
            vectors = _embed_batched(embedder, [embedding_text(r) for r in records], settings.embed_batch_size,
                                     progress)
            embed_s = time.perf_counter() - t1
            target = segments.new_base_path(data_dir, start.next_seq)
            fresh_base(target, records, {record_id(r): vectors[i] for i, r in enumerate(records)}, settings,
                       embedding_model=embedder.name, embedding_dim=embedder.dim, rebuild=True)
            new = segments.Manifest(
                version=start.version + 1, base=str(target.relative_to(data_dir)), deltas=[],
                next_seq=start.next_seq + 1, compacted_base=start.base, consumed=list(start.deltas),
                recent_writes=start.recent_writes,
                # as a compaction: deltas that forgot memories (or were routed by a base that held
                # forgotten words) hold the forgotten text, so their files go at once
                erased=any(d.forgotten for d in start.deltas) or bool(start.erase_pending),
            )
            segments.publish(data_dir, new)
            removed = segments.remove_unreferenced(data_dir, new)
    finally:
        reader.close()
    return ReembedReport(version=new.version, memories=len(records), model=embedder.name, dim=embedder.dim,
                         previous=previous, removed=removed,
                         seconds={"embed": embed_s, "total": time.perf_counter() - t0})
