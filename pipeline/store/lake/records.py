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

from pipeline.store.ingest import MemoryRecord, _edges_of, content_hash, record_id

# An embedding in the lake: float32, little-endian, as one BLOB.
_VECTOR = np.dtype("<f4")


def vector_bytes(vector: np.ndarray) -> bytes:
    return np.ascontiguousarray(vector, dtype=_VECTOR).tobytes()


def vectors_of(blobs: list[bytes], dim: int) -> np.ndarray:
    """The (n, dim) float32 matrix of ``n`` embedding BLOBs, in their order."""
    if not blobs:
        return np.zeros((0, dim), np.float32)
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
    def from_record(cls, record: MemoryRecord, vector: np.ndarray, now: datetime) -> LakeMemory:
        """``record`` (validated as ingest validates it) with its embedding;
        ``now`` (naive UTC) stands for a missing ``created_at`` and is ``ingested_at``."""
        return cls(id=record_id(record), namespace=record.namespace, content=record.content,
                   content_type=record.content_type, created_at=record.created_at or now,
                   content_hash=content_hash(record.content), embedding=np.asarray(vector, np.float32),
                   ingested_at=now, metadata=record.metadata, context=record.context,
                   topics=sorted(set(record.topics)), concepts=sorted(set(record.concepts)),
                   edges=_edges_of(record))

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

    def __post_init__(self) -> None:
        ids = [m.id for m in self.remember]
        if len(set(ids)) != len(ids):
            raise ValueError("a write remembers each id once")
        if set(ids) & set(self.forget):
            raise ValueError("a write may not both remember and forget one id")


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
