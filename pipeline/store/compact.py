"""Compaction: merge the published deltas into a new base, in the background.

It copies the base to a fresh file (no reader has it open) and applies the
deltas there in one transaction (forgotten memories deleted with their tree
places, annotations and every link to or from them; new and rewritten ones
placed in the tree, whose touched topics and centroids follow; the full-text
index rebuilt). When a base memory is forgotten or rewritten, or a base link
points at a forgotten one, the copy is held in memory instead and the new
base written afresh from its live rows, so no deleted row survives in a free
block of the file; in the namespaces that held forgotten memories, a topic
key made with a word no live member holds any more is renamed without it
(``tree.drop_stale_words``). It fsyncs the new
base, then, holding ``WRITE.lock`` only for that moment, publishes a manifest
naming it and the deltas written meanwhile, and removes the files no reader
needs any more (``segments.remove_unreferenced``): the old base, and the
merged deltas at once when they held a forgotten memory (``Manifest.erased``;
otherwise at the next compaction, for readers still on the old base). After
one compaction a forgotten memory's text and id are in no file of the store.
On disk at any moment: the base, the deltas and this one output.

Writes go on while it works (they take ``WRITE.lock`` for their own delta
only) and so do queries (readers load the new base in the background). A
compaction killed at any point leaves the previous manifest in force and at
most an unpublished file, removed by the next compaction.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.embedders import model_identity
from pipeline.errors import StoreError
from pipeline.settings import Settings
from pipeline.store import segments
from pipeline.store.database import Store, one
from pipeline.store.ingest import MemoryRecord, ingest_records, rebuild_tree, relabel_topics
from pipeline.store.overlay import Delta, DeltaMemory, Overlay, Prepared


@dataclass
class CompactReport:
    version: int = 0
    base: str | None = None
    merged_deltas: int = 0
    memories: int = 0  # delta memories written into the base
    forgotten: int = 0  # forgotten memories erased from the store's files (base and merged deltas)
    removed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ran: bool = True  # False: another compaction was running, or there was nothing to merge

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "base": self.base, "merged_deltas": self.merged_deltas,
                "memories": self.memories, "forgotten": self.forgotten, "removed": self.removed,
                "seconds": round(self.seconds, 3), "ran": self.ran}


def _record(m: DeltaMemory, forgotten: set[str]) -> MemoryRecord:
    """``m`` as a record for the base, without its links to ``forgotten`` memories."""
    def live(ids: list[str]) -> list[str]:
        return sorted(set(ids) - forgotten)

    return MemoryRecord.model_construct(
        id=m.id, namespace=m.namespace, content=m.content, content_type=m.content_type, created_at=m.created_at,
        topics=sorted(m.topics), concepts=sorted(m.concepts), supersedes=live(m.supersedes),
        conflicts=live(m.conflicts), supported_by=live(m.supported_by), context=m.context, metadata=m.metadata,
    )


def _rewrites_base(base: Path, ids: set[str], forgotten: set[str]) -> bool:
    """Whether the base holds any of ``ids`` (a memory the deltas forget or
    rewrite) or a link to or from a ``forgotten`` one."""
    if not ids:
        return False
    with Store.open(base, read_only=True) as store:
        if store.existing_ids(ids):
            return True
        return bool(forgotten) and one(
            store.con, "SELECT count(*) FROM edges WHERE src IN (SELECT unnest(?)) OR dst IN (SELECT unnest(?))",
            [sorted(forgotten), sorted(forgotten)])[0] > 0


def _apply(store: Store, records: list[MemoryRecord], vectors: dict[str, np.ndarray], forget: set[str],
           settings: Settings, rebuild: bool) -> None:
    """Write ``records`` (embeddings in ``vectors``) into ``store`` and delete
    ``forget``: placed in the tree, the full-text index rebuilt; ``rebuild``
    re-clusters every namespace."""
    # a topic's key is made of words of its members' texts: those
    # of the namespaces that held forgotten memories are checked
    relabel = [r[0] for r in store.con.execute(
        "SELECT DISTINCT namespace FROM memories WHERE id IN (SELECT unnest(?)) ORDER BY 1",
        [sorted(forget)]).fetchall()] if forget else []
    ingest_records(store, records, None, settings,  # type: ignore[arg-type]
                   vectors_of=vectors, forget=sorted(forget))
    if rebuild:
        rebuild_tree(store, settings)
    elif relabel:
        relabel_topics(store, settings, relabel)


def fresh_base(target: Path, records: list[MemoryRecord], vectors: dict[str, np.ndarray], settings: Settings, *,
               embedding_model: str, embedding_dim: int | None, rebuild: bool = False,
               meta: dict[str, str] | None = None) -> None:
    """A new base file at ``target`` holding ``records`` (embeddings in
    ``vectors``, by id), indexed as every base is (the topic tree, the
    full-text index), with ``meta`` added to its ``store_meta``; fsynced.
    Built under ``target``.work and renamed: a reader never sees it half written."""
    with _building(target) as work:
        with Store.open(work, read_only=False, embedding_model=embedding_model, embedding_dim=embedding_dim) as store:
            _apply(store, records, vectors, set(), settings, rebuild)
            for key, value in (meta or {}).items():
                store.set_meta(key, value)
            store.con.execute("CHECKPOINT")
        work.rename(target)


@contextmanager
def _building(target: Path) -> Iterator[Path]:
    """The work path a new base file is built at before it becomes ``target``;
    ``target`` is fsynced (with its folder) when the block ends, and on any
    failure neither file is left."""
    work = target.with_name(target.name + ".work")
    try:
        yield work
        segments.fsync_file(target)
        segments.fsync_dir(target.parent)
    except BaseException:
        for path in (target, work):
            segments.remove_file(path)
        raise


def compact(settings: Settings, *, extra: Prepared | None = None, rebuild: bool = False,
            wait: bool = False, write_id: str | None = None) -> CompactReport:
    """Merge every published delta (and ``extra``, a write going straight into
    the base, whose id is ``write_id``) into a new base and publish it. ``rebuild`` re-clusters every
    namespace too (``dimple reindex``). Without ``wait`` it returns at once
    (``ran`` False) when another compaction is running."""
    if settings.store.engine == "lake":
        raise StoreError("store.engine: the lake compacts with pipeline.store.maintenance.compact "
                         "(pipeline.store.lake.compaction), not the segment store's compaction")
    t0 = time.perf_counter()
    data_dir = settings.data_dir
    with segments.compact_lock(data_dir, wait=wait) as held:
        if not held:
            return CompactReport(ran=False)
        start = segments.read_manifest(data_dir) or segments.Manifest()
        consumed = list(start.deltas)
        if not consumed and (extra is None or extra.empty) and not rebuild:
            # nothing to merge; a compaction killed between publishing and
            # removing may have left files behind: they go now
            with segments.write_lock(data_dir, wait_s=settings.write_wait_s):
                now = segments.read_manifest(data_dir) or segments.Manifest()
                removed = segments.remove_unreferenced(data_dir, now)
            return CompactReport(version=now.version, base=now.base, removed=removed, ran=False)
        with segments.write_lock(data_dir, wait_s=settings.write_wait_s):
            reserve = segments.read_manifest(data_dir) or segments.Manifest()
            seq = reserve.next_seq
            reserve.next_seq += 1
            segments.publish(data_dir, reserve)  # the number is ours; the state is unchanged
        target = segments.new_base_path(data_dir, seq)
        with _building(target) as work:
            merged = Overlay.build(0, [Delta.load(data_dir, d) for d in consumed], None)
            members = dict(merged.members)
            vectors = {m: merged.emb[i] for i, m in enumerate(merged.ids)}
            forget = set(merged.forgotten)
            if extra is not None:
                for i, m in enumerate(extra.memories):
                    members[m.id] = m
                    vectors[m.id] = extra.vectors[i] if extra.vectors is not None else np.zeros(0, np.float32)
                    forget.discard(m.id)
                forget |= {f["id"] for f in extra.forget}
                for mid in forget:
                    members.pop(mid, None)
            records = [_record(members[m], forget) for m in sorted(members)]
            dim = next(iter(vectors.values())).shape[0] if vectors else None
            # DuckDB leaves deleted and overwritten rows in free blocks of the
            # file it updates: when a base memory is forgotten or rewritten, the
            # new base is written afresh from the live rows, out of a copy held
            # in memory (not a second file: disk holds the base, the deltas and
            # this one output); otherwise the deltas are applied to a file copy
            afresh = start.base is not None and (
                rebuild or _rewrites_base(data_dir / start.base, forget | set(members), forget))
            if start.base is None:
                model = extra.model if extra is not None and extra.model else model_identity(settings.embedding_model)
                fresh_base(target, records, vectors, settings, embedding_model=model,
                           embedding_dim=dim, rebuild=rebuild)
            else:
                if afresh:
                    opened = Store.copy_in_memory(data_dir / start.base, temp_directory=work)
                else:
                    shutil.copyfile(data_dir / start.base, work)
                    opened = Store.open(work, read_only=False)
                with opened as store:
                    _apply(store, records, vectors, forget, settings, rebuild)
                    if afresh:
                        # ATTACH takes no parameters: the path is ours (data dir + segment name), quoted
                        store.con.execute("ATTACH '" + str(target).replace("'", "''") + "' AS fresh")
                        store.con.execute("COPY FROM DATABASE memory TO fresh")
                        store.con.execute("DETACH fresh")
                    else:
                        store.con.execute("CHECKPOINT")
                if afresh:
                    segments.remove_file(work)  # the in-memory copy's spill folder, if it spilled
                else:
                    work.rename(target)
        with segments.write_lock(data_dir, wait_s=settings.write_wait_s):
            now = segments.read_manifest(data_dir) or segments.Manifest()
            done = {d.seq for d in consumed}
            left = [d for d in now.deltas if d.seq not in done]
            new = segments.Manifest(
                version=now.version + 1, base=str(target.relative_to(data_dir)),
                deltas=left, next_seq=now.next_seq,
                compacted_base=start.base, consumed=consumed, recent_writes=now.recent_writes,
                # the deltas written while an erase ran were routed to the old
                # base's topic keys, which may hold a forgotten word: merging
                # them erases too (their files go at once)
                erased=bool(forget) or bool(done & set(start.erase_pending)),
                erase_pending=sorted({d.seq for d in left} if forget
                                     else {d.seq for d in left} & set(now.erase_pending)),
            )
            new.note_write(write_id)
            segments.publish(data_dir, new)
            removed = segments.remove_unreferenced(data_dir, new)
    report = CompactReport(version=new.version, base=new.base, merged_deltas=len(consumed), memories=len(records),
                           forgotten=len(forget), removed=removed, seconds=time.perf_counter() - t0)
    if new.erase_pending:
        # writes came in while this one erased: merge them now, so no file
        # keeps a forgotten word past this compaction
        after = compact(settings, wait=True)
        report.version, report.base, report.removed = after.version, after.base, report.removed + after.removed
        report.merged_deltas += after.merged_deltas
        report.seconds = time.perf_counter() - t0
    return report
