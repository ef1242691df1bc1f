"""What the lake holds and what a write carries: plain values, no SQL.

A ``LakeMemory`` is one memory as the record tables keep it (the columns of
``schema/lake/001_records.sql``, its user topics, concepts and the links it
declares) with its embedding; a ``LakeWrite`` is one remember/forget/ingest
batch, committed as one catalog transaction (``pipeline.store.lake.commit``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from pipeline.errors import ModelMismatchError
from pipeline.store.ingest import MemoryRecord, _edges_of, content_hash, record_id

# An embedding in the lake: float32, little-endian, as one BLOB.
_VECTOR = np.dtype("<f4")


def vector_bytes(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype=_VECTOR).tobytes()


def vectors_of(blobs: list[bytes], dim: int) -> np.ndarray:
    """The (n, dim) float32 matrix of ``n`` embedding BLOBs, in their order."""
    if not blobs:
        return np.zeros((0, dim), np.float32)
    if any(len(b) != dim * _VECTOR.itemsize for b in blobs):
        sizes = sorted({len(b) // _VECTOR.itemsize for b in blobs} - {dim})
        raise ModelMismatchError("embedding_model", f"the lake's embeddings are {sizes[0]}-d, not the {dim}-d this "
                                 "process opened it with: it was re-embedded since ('dimple reembed'); start this "
                                 "process again with the model the lake records ('dimple stats')")
    return np.frombuffer(b"".join(blobs), dtype=_VECTOR).reshape(len(blobs), dim).astype(np.float32)


@dataclass
class LakeMemory:
    """One memory with everything the record tables keep of it."""

    id: str
    namespace: str
    content: str
    content_type: str
    created_at: datetime
    content_hash: str
    embedding: np.ndarray
    ingested_at: datetime
    metadata: dict[str, Any] | None = None
    context: str | None = None
    topics: list[str] = field(default_factory=list)
    concepts: list[str] = field(default_factory=list)
    # (src, dst, kind) edges this memory declares (it is their origin)
    edges: list[tuple[str, str, str]] = field(default_factory=list)

    @classmethod
    def from_row(cls, row: dict[str, Any], embedding: np.ndarray, topics: list[str], concepts: list[str],
                 edges: list[tuple[str, str, str]]) -> LakeMemory:
        """A ``memories`` row (its columns by name; ``metadata`` as JSON text) with its annotations."""
        metadata = row["metadata"]
        return cls(id=row["id"], namespace=row["namespace"], content=row["content"],
                   content_type=row["content_type"], created_at=row["created_at"], content_hash=row["content_hash"],
                   embedding=embedding, metadata=None if metadata is None else json.loads(metadata),
                   context=row["context"], ingested_at=row["ingested_at"], topics=topics, concepts=concepts,
                   edges=edges)

    @classmethod
    def from_record(cls, record: MemoryRecord, vector: np.ndarray, now: datetime) -> LakeMemory:
        """``record`` (validated as ingest validates it) with its embedding;
        ``now`` (naive UTC) stands for a missing ``created_at`` and is ``ingested_at``."""
        return cls(id=record_id(record), namespace=record.namespace, content=record.content,
                   content_type=record.content_type, created_at=record.created_at or now,
                   content_hash=content_hash(record.content), embedding=np.asarray(vector, np.float32),
                   ingested_at=now, metadata=record.metadata, context=record.context,
                   topics=sorted(set(record.topics)), concepts=sorted(set(record.concepts)),
                   edges=_edges_of(record))

    def record(self) -> MemoryRecord:
        """This memory as the record a user wrote (``from_record``'s inverse,
        ``created_at`` as stored): what a base is built from (``pipeline.store.lake.derive``)."""
        def linked(kind: str, end: int) -> list[str]:
            return sorted(edge[end] for edge in self.edges if edge[2] == kind)

        return MemoryRecord.model_construct(
            id=self.id, namespace=self.namespace, content=self.content, content_type=self.content_type,
            created_at=self.created_at, topics=sorted(self.topics), concepts=sorted(self.concepts),
            supersedes=linked("supersedes", 1), conflicts=linked("conflicts", 1), supported_by=linked("supports", 0),
            context=self.context, metadata=self.metadata)

    @property
    def metadata_json(self) -> str | None:
        return None if self.metadata is None else json.dumps(self.metadata, ensure_ascii=False, sort_keys=True)


@dataclass
class LakeWrite:
    """One write: memories to remember (insert or replace, by id) and ids to forget.

    ``write_id`` makes it idempotent: a write whose id the lake already holds
    is not applied again (a broker message delivered twice). Unset, the write
    gets a fresh id (it cannot be recognised if sent again)."""

    remember: list[LakeMemory] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)
    write_id: str = field(default_factory=lambda: f"w-{uuid.uuid4().hex}")
    # the model whose vectors ``remember`` carries: the commit refuses it when the
    # lake records another (a ``dimple reembed`` committed since); None: not checked
    embedding_model: str | None = None
    # validated against a snapshot (``writes._write_lake``): the commit checks again
    # that its links' targets are live. Off for a copy whose links may name a later
    # batch's memories (``dimple migrate``) and for tests that write links as given.
    validated: bool = False

    def __post_init__(self) -> None:
        ids = [m.id for m in self.remember]
        if len(set(ids)) != len(ids):
            raise ValueError("a write remembers each id once")
        if set(ids) & set(self.forget):
            raise ValueError("a write may not both remember and forget one id")

    def link_targets(self) -> list[str]:
        """The memories a ``validated`` write's links name outside the write
        itself: the commit checks that each is still live (``commit.LinkTargetGone``)."""
        if not self.validated:
            return []
        own = {m.id for m in self.remember}
        return sorted({end for m in self.remember for src, dst, _ in m.edges for end in (src, dst)} - own)


@dataclass
class Committed:
    """What a commit did: the snapshot that holds the write, and whether it was
    a replay (the write id was already committed, nothing written again)."""

    write_id: str
    snapshot: int
    replayed: bool = False
    remembered: int = 0
    forgotten: int = 0
    attempts: int = 1


@dataclass
class TableChanges:
    """The rows one table gained and lost between two snapshots, as
    ``(snapshot, row)`` pairs (``row`` a dict of the table's columns) in commit order."""

    inserted: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    deleted: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


@dataclass
class Changes:
    """Everything committed after snapshot ``since`` up to and including ``until``."""

    since: int
    until: int
    tables: dict[str, TableChanges] = field(default_factory=dict)

    def ids(self, kind: str, table: str = "memories", column: str = "id") -> list[str]:
        """The ``column`` values of ``table``'s ``kind`` ('inserted' or 'deleted') rows, in commit order."""
        rows = getattr(self.tables.get(table, TableChanges()), kind)
        return [row[column] for _, row in rows]

    def writes(self, dim: int) -> list[SnapshotWrite]:
        """What each snapshot did to the memories, in commit order: the memories
        it wrote whole (a replacement deletes and inserts an id in one
        snapshot; its topics, concepts and declared edges are rewritten with it)
        and the ids it forgot. A forget also deletes the edges other memories
        declared to or from the forgotten one: those are ``unlinked`` (a link
        to a memory that is not live is never read, but one remembered again
        must not get its old links back)."""
        memories = self.tables.get("memories", TableChanges())
        inserted: dict[int, list[dict[str, Any]]] = {}
        deleted: dict[int, set[str]] = {}
        for snapshot, row in memories.inserted:
            inserted.setdefault(snapshot, []).append(row)
        for snapshot, row in memories.deleted:
            deleted.setdefault(snapshot, set()).add(row["id"])
        topics: dict[tuple[int, str], list[str]] = {}
        concepts: dict[tuple[int, str], list[str]] = {}
        edges: dict[tuple[int, str], list[tuple[str, str, str]]] = {}
        for snapshot, row in self.tables.get("memory_topics", TableChanges()).inserted:
            topics.setdefault((snapshot, row["memory_id"]), []).append(row["topic_key"])
        for snapshot, row in self.tables.get("memory_concepts", TableChanges()).inserted:
            concepts.setdefault((snapshot, row["memory_id"]), []).append(row["concept"])
        for snapshot, row in self.tables.get("edges", TableChanges()).inserted:
            edges.setdefault((snapshot, row["origin"]), []).append((row["src"], row["dst"], row["kind"]))
        cut: dict[int, list[tuple[str, str, str, str]]] = {}
        for snapshot, row in self.tables.get("edges", TableChanges()).deleted:
            if row["origin"] not in deleted.get(snapshot, set()):  # not rewritten or forgotten with its memory
                cut.setdefault(snapshot, []).append((row["src"], row["dst"], row["kind"], row["origin"]))
        out = []
        for snapshot in sorted(set(inserted) | set(deleted)):
            rows = sorted(inserted.get(snapshot, []), key=lambda r: r["id"])
            vectors = vectors_of([r["embedding"] for r in rows], dim)
            remembered = [LakeMemory.from_row(row, vectors[i], sorted(topics.get((snapshot, row["id"]), [])),
                                              sorted(concepts.get((snapshot, row["id"]), [])),
                                              sorted(edges.get((snapshot, row["id"]), [])))
                          for i, row in enumerate(rows)]
            gone = deleted.get(snapshot, set()) - {m.id for m in remembered}
            out.append(SnapshotWrite(snapshot, remembered, sorted(gone), sorted(set(cut.get(snapshot, [])))))
        return out


@dataclass
class SnapshotWrite:
    """What one snapshot did to the memories (``Changes.writes``)."""

    snapshot: int
    remembered: list[LakeMemory] = field(default_factory=list)  # inserted or replaced, whole, sorted by id
    forgotten: list[str] = field(default_factory=list)  # deleted and not written again, sorted
    # (src, dst, kind, origin): edges a live memory declared, deleted because the other end was forgotten
    unlinked: list[tuple[str, str, str, str]] = field(default_factory=list)
