"""Writes: remember (upsert) and forget, each one catalog transaction of the
lake whose cost is the size of the write, not of the store (docs/LAKE.md).

A write reads the lake's latest snapshot (``pipeline.store.reader``),
validates against it (edges must point at live memories or at the write's
own), leaves out what the store already holds as given, embeds only changed
content, and commits one ``LakeWrite``; its version is the snapshot it
committed. Writers hold no lock: the catalog serialises their commits.

A first write (no base yet) and a large one (``compact_delta_memories`` or
more) build a base for their snapshot at once, as ``dimple ingest`` of a
whole file always did.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from pipeline.contracts import id_problem
from pipeline.embedders import Embedder, check_model
from pipeline.errors import InputError, LineError
from pipeline.settings import Settings
from pipeline.store.database import rows_by_ids, utcnow
from pipeline.store.delta import delta_memories
from pipeline.store.ingest import (
    IngestReport,
    MemoryRecord,
    ParsedFile,
    _embed_batched,
    content_hash,
    embedding_text,
    parse_lines,
    record_id,
    unchanged_ids,
    validate,
)
from pipeline.store.lake.commit import LinkTargetGone
from pipeline.store.lake.follow import Follower, reader_for
from pipeline.store.lake.records import LakeMemory, LakeWrite
from pipeline.store.overlay import DeltaMemory, Overlay, Prepared
from pipeline.store.reader import Reader, Snapshot


class LiveView:
    """The published state as validation reads it: live ids and current versions,
    the base's through ``con`` (``live_view``: a cursor of the reading thread's own)."""

    def __init__(self, snap: Snapshot | None, con=None):
        self.snap = snap
        self.overlay = snap.overlay if snap is not None else None
        self.con = con

    def existing_ids(self, ids) -> set[str]:
        ids = list(ids)
        out: set[str] = set()
        if self.overlay is not None:
            out |= {m for m in ids if m in self.overlay.members}
        rest = [m for m in ids if m not in out and (self.overlay is None or m not in self.overlay.touched)]
        if rest and self.con is not None:
            out |= {r[0] for r in rows_by_ids(self.con, "SELECT id FROM memories WHERE {id}", rest, lookups=True)}
        return out

    def in_base(self, ids: list[str]) -> dict[str, tuple[str, str, datetime, np.ndarray]]:
        """(namespace, content hash, created_at, embedding) of the live base memories among ``ids``."""
        rest = [m for m in ids if self.overlay is None or m not in self.overlay.touched]
        if not rest or self.con is None:
            return {}
        return {
            r[0]: (r[1], r[2], r[3], np.asarray(r[4], dtype=np.float32))
            for r in rows_by_ids(
                self.con, "SELECT id, namespace, content_hash, created_at, embedding FROM memories WHERE {id}", rest, lookups=True)
        }


@contextmanager
def live_view(snap: Snapshot | None) -> Iterator[LiveView]:
    """``snap`` as validation reads it, through a cursor of this thread's own on
    its base, the base kept open meanwhile (``Snapshot.view``). Not the base's
    connection: a DuckDB connection runs one statement at a time, and a
    process's other threads (a follower extending its view, the upkeep
    thread's settings poll) read through it too; interleaved, one thread
    fetches another's rows."""
    if snap is None:
        yield LiveView(None)
        return
    with snap.view() as view:
        yield LiveView(snap, view.cursor)


def _same_as_delta(record: MemoryRecord, m: DeltaMemory) -> bool:
    return (
        (m.namespace, m.content, m.content_type, m.context) == (record.namespace, record.content,
                                                                 record.content_type, record.context)
        and (record.created_at is None or record.created_at == m.created_at)
        and _canonical(m.metadata) == _canonical(record.metadata)
        and sorted(m.topics) == record.topics and sorted(m.concepts) == record.concepts
        and sorted(m.supersedes) == record.supersedes and sorted(m.conflicts) == record.conflicts
        and sorted(m.supported_by) == record.supported_by
    )


def _canonical(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


def prepare(records: list[MemoryRecord], live: LiveView, embedder_for, settings: Settings,
            *, now: datetime | None = None, progress: bool = False) -> Prepared:
    """Leave out unchanged records and embed changed content: the write's rows
    (a reader tokenizes and routes them when it merges the snapshot over its
    base, ``pipeline.store.lake.derive``)."""
    out = Prepared()
    overlay = live.overlay
    ids = [record_id(r) for r in records]
    same_base = unchanged_ids(live.con, [r for r in records if overlay is None or r.id not in overlay.touched]) \
        if live.con is not None else set()
    base = live.in_base(ids)
    # a memory whose links a forget cut (the lake: ``Overlay.unlinked``) is written again whole
    cut = {e[3] for e in overlay.unlinked} if overlay is not None else set()
    keep: list[MemoryRecord] = []
    for r in records:
        current = overlay.members.get(record_id(r)) if overlay is not None else None
        if r.id not in cut and (r.id in same_base or (current is not None and _same_as_delta(r, current))):
            out.unchanged += 1
        else:
            keep.append(r)
    if not keep:
        return out
    now = now or utcnow()
    vectors: list[np.ndarray | None] = []
    created: list[datetime] = []
    for r in keep:
        rid = record_id(r)
        digest = content_hash(r.content)
        current = overlay.members.get(rid) if overlay is not None else None
        old = None
        if current is not None and overlay is not None:
            old = (current.namespace, current.content_hash, current.created_at, overlay.emb[overlay.row_of[rid]])
        elif rid in base:
            old = base[rid]
        if old is None:
            out.inserted += 1
        else:
            out.updated += 1
        reuse = old is not None and old[0] == r.namespace and old[1] == digest
        vectors.append(old[3] if reuse and old is not None else None)
        created.append(r.created_at or (old[2] if old is not None else now))
    todo = [i for i, v in enumerate(vectors) if v is None]
    if todo:
        t0 = time.perf_counter()
        embedder = embedder_for(len(todo))
        store = live.snap.store if live.snap is not None else None
        if store is not None:  # before embedding: a store holds one model's vectors
            check_model(store.info.embedding_model, store.info.embedding_dim, embedder.name, embedder.dim,
                        f"the store in {settings.data_dir}")
        out.model = embedder.name
        fresh = _embed_batched(embedder, [embedding_text(keep[i]) for i in todo], settings.embed_batch_size, progress)
        for i, vec in zip(todo, fresh):
            vectors[i] = np.asarray(vec, dtype=np.float32)
        out.embedded = len(todo)
        out.embed_s = time.perf_counter() - t0
    matrix = np.stack([v for v in vectors if v is not None]).astype(np.float32)
    dim = matrix.shape[1]
    out.memories = delta_memories(keep, created, matrix, settings, None, for_delta=False)
    out.vectors = matrix.reshape(len(keep), dim)
    return out


# -- the write itself ---------------------------------------------------------------
class WriteResult(BaseModel):
    """What a write did, as ``remember`` and ``forget`` return it (JSON on the wire)."""

    model_config = ConfigDict(extra="forbid")

    ids: list[str] = Field(default_factory=list, description="the remembered records' ids, in the order given")
    inserted: int = 0
    updated: int = 0
    unchanged: int = Field(0, description="records the store already held exactly as given: nothing written")
    embedded: int = 0
    forgotten: int = Field(0, description="live memories forgotten")
    not_found: list[str] = Field(default_factory=list, description="ids to forget that no live memory has")
    skipped: list[str] = Field(default_factory=list, description="invalid records left out (skip_invalid)")
    namespaces: list[str] = Field(default_factory=list)
    version: int = Field(0, description="the store version (manifest) the write published, or the one it found")
    delta: int | None = Field(None, description="the delta segment written (None: nothing, or straight into a base)")
    compacted: bool = Field(False, description="the write went straight into a new base")
    compact_due: bool = Field(False, description="the deltas passed a compaction threshold")
    replayed: bool = Field(False, description="this write (a broker message delivered again) had already been "
                                              "published, at ``version``: nothing was written again")
    seconds: dict[str, float] = Field(default_factory=dict)


@dataclass
class WriteReport(IngestReport):
    ids: list[str] = field(default_factory=list)
    forgotten: int = 0
    not_found: list[str] = field(default_factory=list)
    version: int = 0
    delta: int | None = None
    compacted: bool = False
    compact_due: bool = False
    replayed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "ids": self.ids, "forgotten": self.forgotten, "not_found": self.not_found,
                "version": self.version, "delta": self.delta, "compacted": self.compacted,
                "compact_due": self.compact_due, "replayed": self.replayed}

    def result(self) -> WriteResult:
        return WriteResult.model_validate(self.as_dict())


def _embedder_for(settings: Settings, embedder: Embedder | None, embedders: Callable[[bool], Embedder] | None):
    """The embedder for ``n`` new texts: ``embedder`` when given, else the
    query embedder for at most one batch (no torch to import) and the bulk one
    for more (``make_embedder``), from ``embedders(bulk)`` (a worker's loaded
    ones) or made here."""
    def pick(n: int) -> Embedder:
        if embedder is not None:
            return embedder
        bulk = n > settings.embed_batch_size
        if embedders is not None:
            return embedders(bulk)
        # looked up on each call, where a caller (or a test) may have replaced it
        from pipeline.embedders import make_embedder

        return make_embedder(settings, bulk=bulk)
    return pick


def write(settings: Settings, parsed: ParsedFile | None = None, forget: list[str] | None = None, *,
          reason: str | None = None, skip_invalid: bool = False, embedder: Embedder | None = None,
          embedders: Callable[[bool], Embedder] | None = None, reader: Reader | None = None,
          progress: bool = False, write_id: str | None = None) -> WriteReport:
    """Remember ``parsed``'s records and forget ``forget``'s ids as one write.

    Raises ``IngestValidationError`` for bad records (nothing written) unless
    ``skip_invalid``. Returns once the write is committed. New content is
    embedded by ``embedder``, else by ``embedders(bulk)`` or ``make_embedder``
    (``_embedder_for``). ``write_id`` (a broker message's task id) makes a
    second delivery of the same message a no-op (``replayed``): the lake keeps
    every write id it committed (``Follower.written``). ``reason`` is the
    caller's; the lake keeps no reason per forget.
    """
    t0 = time.perf_counter()
    parsed = parsed or ParsedFile([], [])
    forget = list(dict.fromkeys(forget or []))
    for i, mid in enumerate(forget):
        if (problem := id_problem(mid)) is not None:
            raise InputError(f"ids[{i}]", problem)
    own = reader is None
    reader = reader or reader_for(settings)
    try:
        return _write_lake(settings, reader, parsed, forget, skip_invalid=skip_invalid,
                           embedder_for=_embedder_for(settings, embedder, embedders), progress=progress,
                           write_id=write_id, t0=t0)
    finally:
        if own:
            reader.close()


def _write_lake(settings: Settings, reader: Reader, parsed: ParsedFile, forget: list[str], *, skip_invalid: bool,
                embedder_for, progress: bool, write_id: str | None, t0: float) -> WriteReport:
    """``write``: validated and prepared
    against the latest snapshot (unchanged records left out, embeddings of
    unchanged content reused, a replaced memory's ``created_at`` kept), then
    one catalog transaction (``LakeWrite``); ``version`` is its snapshot.

    Writers hold no lock between reading the snapshot and committing; the
    commit checks again what a write committed in between can invalidate
    (``commit._still_valid``): a link to a memory forgotten meanwhile makes the
    write start again from a newer snapshot, where validation refuses it
    (or ``skip_invalid`` leaves the record out), as if the forget came first."""
    follower = reader.lake
    assert isinstance(follower, Follower)
    if write_id is not None and (applied := follower.written(write_id)) is not None:
        return WriteReport(ids=[record_id(r) for r in parsed.records], version=applied, replayed=True)
    deadline = time.monotonic() + settings.write_wait_s
    skipped: list[LineError] = []  # every attempt's: each validation drops its records from ``parsed``
    while True:
        try:
            return _write_lake_once(settings, reader, follower, parsed, forget, skipped, skip_invalid=skip_invalid,
                                    embedder_for=embedder_for, progress=progress, write_id=write_id, t0=t0)
        except LinkTargetGone:
            if time.monotonic() > deadline:
                raise


def _write_lake_once(settings: Settings, reader: Reader, follower: Follower, parsed: ParsedFile, forget: list[str],
                     skipped: list[LineError], *, skip_invalid: bool, embedder_for, progress: bool,
                     write_id: str | None, t0: float) -> WriteReport:
    """One validation against the latest snapshot, and its commit (``_write_lake``);
    the records it leaves out are added to ``skipped`` (the earlier attempts')."""
    snap = reader.snapshot(fresh=True)
    with live_view(snap) as live:  # a cursor of this thread's own: the base's connection answers one at a time
        skipped.extend(validate(parsed, live, skip_invalid, forgotten=frozenset(forget)))  # type: ignore[arg-type]
        skipped.sort(key=lambda e: (e.line, e.field))
        ids = [record_id(r) for r in parsed.records]  # the valid ones
        forgotten_live = live.existing_ids(forget)
        clash = sorted(forgotten_live & set(ids))
        if clash:
            raise InputError("ids", f"{clash[0]!r} is both remembered and forgotten in one write")
        now = utcnow()
        prepared = prepare(parsed.records, live, embedder_for, settings, now=now, progress=progress)
        gone = [m for m in forget if m in forgotten_live]
        report = WriteReport(inserted=prepared.inserted, updated=prepared.updated, unchanged=prepared.unchanged,
                             skipped=list(skipped), embedded=prepared.embedded, forgotten=len(gone),
                             not_found=[m for m in forget if m not in forgotten_live], ids=ids,
                             namespaces=sorted({m.namespace for m in prepared.memories}),
                             version=snap.version if snap is not None else 0)
        if prepared.memories or gone:
            dim = prepared.vectors.shape[1] if prepared.vectors is not None else None
            write = LakeWrite(remember=[LakeMemory.from_record(_as_memory_record(m), prepared.vectors[i], now)
                                        for i, m in enumerate(prepared.memories)] if prepared.vectors is not None else [],
                              forget=gone, validated=True)
            # the vectors' model: embedded now (checked against the view's), else the view's own
            held = snap.store.info.embedding_model if snap is not None and snap.store is not None else None
            write.embedding_model = prepared.model or (held if held != "unknown" else None)
            if write_id is not None:
                write.write_id = write_id
            done = follower.commit(write, dim)
            report.version, report.replayed = done.snapshot, done.replayed
            if not done.replayed:  # what the commit found live: another process may have forgotten one first
                report.forgotten = done.forgotten
            # a first base (none yet), or a write a delta would carry badly: built now, at its snapshot
            if not done.replayed and (snap is None or snap.store is None
                                      or len(prepared.memories) >= settings.compact_delta_memories):
                # the write's version is the snapshot that lists its base: the state it published
                base, report.version = follower.build_after_write(done.snapshot, write.write_id)
                report.compacted = base is not None
            elif snap is not None:
                report.compact_due = lake_compaction_due(settings, snap, len(prepared.memories) + len(gone),
                                                         since=follower.newest_base())
        if not report.compact_due and not report.compacted:
            report.compact_due = follower.erase_due()
        report.seconds = {"embed": prepared.embed_s, "total": time.perf_counter() - t0}
        return report


def _as_memory_record(m: DeltaMemory) -> MemoryRecord:
    """A prepared memory as the record it was prepared from, its ``created_at`` resolved."""
    return MemoryRecord.model_construct(
        id=m.id, namespace=m.namespace, content=m.content, content_type=m.content_type, created_at=m.created_at,
        topics=list(m.topics), concepts=list(m.concepts), supersedes=list(m.supersedes),
        conflicts=list(m.conflicts), supported_by=list(m.supported_by), context=m.context, metadata=m.metadata)


def lake_compaction_due(settings: Settings, snap: Snapshot, written: int | None, since: int = -1) -> bool:
    """Whether the snapshots after ``since`` that ``snap`` merges over its base
    (and a write of ``written`` memories and forgets on top; None: no write)
    passed a threshold (count or memories, in settings). ``since``: the newest
    base listed (``Follower.newest_base``): while a new base loads, ``snap``
    still merges what it holds over the old one, and counting those would
    start a second compaction of what the last one compacted."""
    newer = [d for seq, d in snap.deltas.items() if seq > since]
    held = sum(len(d.memories) + len(d.forget) for d in newer)
    writing = written is not None
    return (len(newer) + writing >= settings.compact_max_deltas
            or held + (written or 0) >= settings.compact_delta_memories)


def compaction_due(settings: Settings, reader: Reader) -> bool:
    """Whether a compaction is due now, as a write past a threshold found it
    (``WriteReport.compact_due``): the deltas since the newest base listed
    passed a threshold, or an erase is due. Asked again by the compaction a
    write sent before it builds anything: each write of a burst past the
    threshold sends one, and the first to run makes the others' moot."""
    follower = reader.lake
    assert isinstance(follower, Follower)
    snap = reader.snapshot(fresh=True)
    if snap is None:
        return False
    return lake_compaction_due(settings, snap, None, since=follower.newest_base()) or follower.erase_due(fresh=True)


def get(settings: Settings, ids: list[str], reader: Reader | None = None) -> list[dict[str, Any]]:
    """The live memories among ``ids``, in the order asked, as a user wrote them
    (missing and forgotten ids are left out), with their links to live
    memories only: a link to a forgotten memory is dropped (SECURITY.md)."""
    own = reader is None
    reader = reader or reader_for(settings)
    try:
        return records_of(reader.snapshot(), ids)
    finally:
        if own:
            reader.close()


def records_of(snap: Snapshot | None, ids: list[str]) -> list[dict[str, Any]]:
    """``get`` at ``snap`` (None: nothing written yet)."""
    if snap is None:
        return []
    overlay = snap.overlay
    found: dict[str, dict[str, Any]] = {}
    for mid in ids:
        m = overlay.members.get(mid)
        if m is not None:
            found[mid] = _as_record(m.id, m.namespace, m.content, m.content_type, m.created_at, m.context,
                                    m.metadata, m.topics, m.concepts, m.supersedes, m.conflicts, m.supported_by)
    rest = [m for m in ids if m not in found and m not in overlay.touched]
    with live_view(snap) as live:
        if rest and live.con is not None:
            found.update(_base_records(live.con, rest))
        _drop_dead_links(found.values(), live)
    if overlay.unlinked:
        _drop_cut_links(found.values(), overlay)
    return [found[m] for m in dict.fromkeys(ids) if m in found]


_LINKS = ("supersedes", "conflicts", "supported_by")


def _drop_dead_links(records, live: LiveView) -> None:
    """Leave out of ``records``' links every memory that is not live (forgotten)."""
    records = list(records)
    linked = {t for r in records for k in _LINKS for t in r[k]}
    alive = live.existing_ids(sorted(linked)) if linked else set()
    for r in records:
        for k in _LINKS:
            r[k] = [t for t in r[k] if t in alive]


def _drop_cut_links(records, overlay: Overlay) -> None:
    """Leave out of ``records``' links those a forget cut on the lake (``Overlay.unlinked``)."""
    for r in records:
        kept = set(overlay.linked(r["id"], [(r["id"], t, "supersedes") for t in r["supersedes"]]
                                  + [(r["id"], t, "conflicts") for t in r["conflicts"]]
                                  + [(t, r["id"], "supports") for t in r["supported_by"]]))
        r["supersedes"] = [t for t in r["supersedes"] if (r["id"], t, "supersedes") in kept]
        r["conflicts"] = [t for t in r["conflicts"] if (r["id"], t, "conflicts") in kept]
        r["supported_by"] = [t for t in r["supported_by"] if (t, r["id"], "supports") in kept]


def _as_record(mid, namespace, content, content_type, created_at, context, metadata, topics, concepts,
               supersedes, conflicts, supported_by) -> dict[str, Any]:
    return {"id": mid, "namespace": namespace, "content": content, "content_type": content_type,
            "created_at": created_at.replace(tzinfo=UTC).isoformat(), "context": context, "metadata": metadata,
            "topics": sorted(topics), "concepts": sorted(concepts), "supersedes": sorted(supersedes),
            "conflicts": sorted(conflicts), "supported_by": sorted(supported_by)}


def _base_records(con, ids: list[str]) -> dict[str, dict[str, Any]]:
    rows = con.execute(
        "SELECT id, namespace, content, content_type, created_at, context, metadata::VARCHAR FROM memories "
        "WHERE id IN (SELECT unnest(?))", [ids]).fetchall()
    if not rows:
        return {}
    known = [r[0] for r in rows]
    topics: dict[str, list[str]] = {}
    for mid, t in con.execute("SELECT memory_id, topic_key FROM memory_topics WHERE kind = 'user' AND "
                              "memory_id IN (SELECT unnest(?))", [known]).fetchall():
        topics.setdefault(mid, []).append(t)
    concepts: dict[str, list[str]] = {}
    for mid, c in con.execute("SELECT memory_id, concept FROM memory_concepts WHERE memory_id IN (SELECT unnest(?))",
                              [known]).fetchall():
        concepts.setdefault(mid, []).append(c)
    edges: dict[str, dict[str, list[str]]] = {}
    for src, dst, kind, origin in con.execute(
        "SELECT src, dst, kind, origin FROM edges WHERE origin IN (SELECT unnest(?))", [known]).fetchall():
        per = edges.setdefault(origin, {"supersedes": [], "conflicts": [], "supported_by": []})
        if kind == "supports":
            per["supported_by"].append(src)
        else:
            per[kind].append(dst)
    out = {}
    for mid, ns, content, ctype, created, context, metadata in rows:
        per = edges.get(mid, {"supersedes": [], "conflicts": [], "supported_by": []})
        out[mid] = _as_record(mid, ns, content, ctype, created, context,
                              None if metadata is None else json.loads(metadata), topics.get(mid, []),
                              concepts.get(mid, []), per["supersedes"], per["conflicts"], per["supported_by"])
    return out


def record_lines(items: Any) -> list[str]:
    """Records given to ``remember`` (a dict, a ``MemoryRecord``, or a list of
    them) as the JSON lines an ingest file would hold, in the caller's order."""
    if isinstance(items, dict | MemoryRecord):
        items = [items]
    if not isinstance(items, list):
        raise InputError("records", "a memory (a dict) or a list of them")
    lines = []
    for i, item in enumerate(items):
        if isinstance(item, MemoryRecord):
            item = item.model_dump(mode="json", exclude_none=True)
        try:
            lines.append(json.dumps(item, ensure_ascii=False, default=_not_json))
        except (TypeError, ValueError) as exc:
            raise InputError(f"records[{i}]", f"not JSON: {exc}") from None
        except RecursionError:  # e.g. metadata nested thousands deep (a file's line says so: parse_lines)
            raise InputError(f"records[{i}]", "nested too deeply to be JSON") from None
    return lines


def parse_records(items: Any, settings: Settings) -> ParsedFile:
    """Records given to ``remember`` (``record_lines``), validated exactly as
    ingest validates lines; errors are numbered by record from 1."""
    parsed = parse_lines(record_lines(items), settings.limits)
    parsed.unit = "record"
    for err in parsed.errors:
        err.unit = "record"
    return parsed


def _not_json(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")
