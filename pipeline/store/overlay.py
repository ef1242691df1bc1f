"""The deltas as a query reads them: every un-compacted write merged in
memory, over the base it is read with, and which base memories are still live.

A delta holds whole memories (upserts: text, annotations, edges, embedding,
full-text terms) and tombstones (forgotten ids), applied in sequence order:
the newest version of an id wins, a later tombstone removes it. Any id a
delta touches is dead in the base, whether replaced or forgotten.

``Overlay`` is built once per published manifest in each query process and
is immutable; it holds the data, the indexes score it:

- vector search (``pipeline.store.vector.delta_hits``) scores live delta
  memories exactly (they are few) and skips dead base rows (``dead_rows``);
- full-text search (``pipeline.store.fulltext.ranking``) scores delta memories
  from their stored terms (``postings``, ``lens``) and the base from its
  postings, both with collection statistics over every live memory
  (``live_stats``, ``delta_df``), so scores equal BM25 over the merged
  corpus, as a compaction would index it;
- augment reads delta memories and edges here and drops dead base ones.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from pipeline.contracts import Scope
from pipeline.store import segments
from pipeline.store.database import rows_by_ids
from pipeline.store.fulltext.index import live_base


@dataclass
class DeltaMemory:
    """One live memory of a delta, as a write prepares it (``pipeline.store.writes.prepare``)."""

    id: str
    namespace: str
    content: str
    content_type: str
    created_at: datetime
    context: str | None
    metadata: Any
    content_hash: str
    topics: list[str]  # given by the user
    concepts: list[str]
    supersedes: list[str]
    conflicts: list[str]
    supported_by: list[str]
    tree: list[str]  # the base leaf it was routed to, then that leaf's ancestors
    fts_len: int
    terms: dict[str, int]  # stemmed term -> frequency, as the FTS extension tokenizes
    seq: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any], seq: int) -> DeltaMemory:
        fields = dict(data)
        fields["created_at"] = datetime.fromisoformat(fields["created_at"])
        return cls(**fields, seq=seq)

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "seq"}
        out["created_at"] = self.created_at.isoformat()
        return out

    @property
    def all_topics(self) -> list[str]:
        return sorted(set(self.topics) | set(self.tree))

    def edges(self) -> list[tuple[str, str, str]]:
        """The (src, dst, kind) edges this memory declares."""
        return (
            [(self.id, t, "supersedes") for t in self.supersedes]
            + [(self.id, t, "conflicts") for t in self.conflicts]
            + [(t, self.id, "supports") for t in self.supported_by]
        )


@dataclass
class Delta:
    """One published delta, parsed once per process (``load``)."""

    seq: int
    memories: list[DeltaMemory]
    vectors: np.ndarray
    forget: list[str]
    # (src, dst, kind, origin) links of live memories cut by this delta's
    # forgets: the lake deletes them (pipeline.store.lake), a delta file never does
    unlinked: list[tuple[str, str, str, str]] = field(default_factory=list)

    @classmethod
    def load(cls, data_dir, ref) -> Delta:
        """Read and parse delta ``ref`` (FileNotFoundError once compaction removed it)."""
        body, vectors = segments.read_delta(data_dir, ref)
        seq = int(body["seq"])
        return cls(seq, [DeltaMemory.from_json(m, seq) for m in body.get("memories", ())], vectors,
                   [item["id"] for item in body.get("forget", ())])


@dataclass
class Prepared:
    """A validated write, ready to become a delta (or part of a base)."""

    memories: list[DeltaMemory] = field(default_factory=list)
    vectors: np.ndarray | None = None
    forget: list[dict[str, Any]] = field(default_factory=list)
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    embedded: int = 0
    embed_s: float = 0.0  # seconds spent embedding ``embedded`` texts
    model: str | None = None  # the embedder's name (``model_identity``) when it embedded any
    not_found: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.memories and not self.forget


@dataclass
class Overlay:
    """Deltas ``seqs`` of manifest ``version`` merged, bound to one base."""

    version: int
    seqs: list[int]
    members: dict[str, DeltaMemory]  # live delta memories by id
    touched: set[str]  # every id a delta wrote or forgot: dead in the base
    forgotten: set[str]  # ids whose last word is a tombstone
    dead_ids: set[str]  # touched ids the base holds
    dead_docids: list[int]  # the base full-text docids of dead memories
    base_docs: int  # live memories of the base, as the full-text leg counts them
    base_len: int  # their summed token count
    ids: list[str] = field(default_factory=list)  # delta memories, sorted
    emb: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    postings: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # term -> (rows, tfs)
    lens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # (src, dst, kind, origin): links of live memories a forget cut (``Delta.unlinked``), hidden even when
    # the other end is remembered again; dropped when the origin is written again (it declares its links anew)
    unlinked: set[tuple[str, str, str, str]] = field(default_factory=set)
    _dead_rows: dict[int, np.ndarray | None] = field(default_factory=dict, repr=False)
    _dead_docs: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    # the base's term -> (termid, df), or None for a term the base lacks: the
    # base never changes, so this is shared by every overlay over it
    # (``pipeline.store.fulltext.search_live`` fills it, bounded)
    base_terms: dict[str, tuple[int, int] | None] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.row_of = {m: i for i, m in enumerate(self.ids)}
        self.ns = np.asarray([self.members[m].namespace for m in self.ids], dtype=object)
        self.ct = np.asarray([self.members[m].content_type for m in self.ids], dtype=object)

    @property
    def empty(self) -> bool:
        return not self.touched

    # -- building -------------------------------------------------------------
    @classmethod
    def build(cls, version: int, deltas: list[Delta], base_con, dim: int = 0,
              base_totals: tuple[int, int] | None = None,
              base_terms: dict[str, tuple[int, int] | None] | None = None) -> Overlay:
        """Merge ``deltas`` (in sequence order) over the base read through
        ``base_con`` (None: no base); ``base_totals`` is ``pipeline.store.fulltext.fulltext_totals``
        of that base when the caller keeps it (it reads every document)."""
        members: dict[str, DeltaMemory] = {}
        vectors: dict[str, np.ndarray] = {}
        touched: set[str] = set()
        forgotten: set[str] = set()
        unlinked: set[tuple[str, str, str, str]] = set()
        seqs = []
        for delta in deltas:
            seqs.append(delta.seq)
            written = {m.id for m in delta.memories} | set(delta.forget)
            if unlinked and written:
                unlinked = {e for e in unlinked if e[3] not in written}
            for row, memory in enumerate(delta.memories):
                members[memory.id] = memory
                vectors[memory.id] = delta.vectors[row]
                forgotten.discard(memory.id)
                touched.add(memory.id)
            for mid in delta.forget:
                members.pop(mid, None)
                vectors.pop(mid, None)
                forgotten.add(mid)
                touched.add(mid)
            unlinked.update(delta.unlinked)
        ids = sorted(members)
        dim = next(iter(vectors.values())).shape[0] if vectors else dim
        emb = np.stack([vectors[m] for m in ids]).astype(np.float32) if ids else np.zeros((0, dim), np.float32)
        lists: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for row, mid in enumerate(ids):
            for term, tf in members[mid].terms.items():
                lists[term].append((row, tf))
        postings = {t: (np.asarray([r for r, _ in p], dtype=np.int64), np.asarray([f for _, f in p], dtype=np.float64))
                    for t, p in lists.items()}
        lens = np.asarray([members[m].fts_len for m in ids], dtype=np.int64)
        dead_ids: set[str] = set()
        dead_docids: list[int] = []
        base_docs = base_len = 0
        if base_con is not None:
            if touched:
                dead_ids = {r[0] for r in rows_by_ids(base_con, "SELECT id FROM memories WHERE {id}", sorted(touched), lookups=True)}
            base_docs, base_len, dead_docids = live_base(base_con, sorted(dead_ids), base_totals)
        return cls(
            version=version, seqs=seqs, members=members, touched=touched, forgotten=forgotten, unlinked=unlinked,
            dead_ids=dead_ids, dead_docids=dead_docids,
            base_docs=base_docs, base_len=base_len, ids=ids, emb=emb, postings=postings, lens=lens,
            base_terms=base_terms if base_terms is not None else {},
        )

    # -- liveness -------------------------------------------------------------
    def dead_mask(self, num_docs: int) -> np.ndarray | None:
        """The base's dead memories as a mask by full-text docid (None: none dead)."""
        if not self.dead_docids:
            return None
        mask = self._dead_docs.get(num_docs)
        if mask is None:
            mask = np.zeros(num_docs, dtype=bool)
            mask[self.dead_docids] = True
            self._dead_docs[num_docs] = mask
        return mask

    def dead_rows(self, index) -> np.ndarray | None:
        """Rows of the base's vector ``index`` that a delta replaced or forgot
        (None when there are none); computed once per index."""
        key = id(index)
        if key not in self._dead_rows:
            rows = [index.row_of[m] for m in self.dead_ids if m in index.row_of]
            mask = None
            if rows:
                mask = np.zeros(index.size, dtype=bool)
                mask[rows] = True
            self._dead_rows = {key: mask}  # one index at a time
        return self._dead_rows[key]

    def live_ids(self, ids: list[str], base_ids: set[str]) -> set[str]:
        """Which of ``ids`` are live: in a delta, or in the base (``base_ids``) and not dead."""
        return {m for m in ids if m in self.members or (m in base_ids and m not in self.touched)}

    def linked(self, origin: str, edges):
        """``edges`` ((src, dst, kind) declared by ``origin``) less those a forget cut (``unlinked``)."""
        if not self.unlinked:
            return list(edges)
        return [e for e in edges if (*e, origin) not in self.unlinked]

    # -- scope ----------------------------------------------------------------
    def rows_in(self, scope: Scope) -> np.ndarray:
        """Delta rows inside ``scope`` (namespace, content types, topics, concepts)."""
        keep = np.ones(len(self.ids), dtype=bool)
        if scope.namespace is not None:
            keep &= self.ns == scope.namespace
        if scope.content_types:
            keep &= np.isin(self.ct, list(scope.content_types))
        if scope.topics or scope.concepts:
            topics, concepts = set(scope.topics), set(scope.concepts)
            for row in np.flatnonzero(keep):
                m = self.members[self.ids[row]]
                if (topics and not topics & set(m.all_topics)) or (concepts and not concepts & set(m.concepts)):
                    keep[row] = False
        return keep

    # -- full-text leg --------------------------------------------------------
    def live_stats(self) -> tuple[int, float]:
        """(number of live memories, their mean token count) over base and deltas."""
        n = self.base_docs + len(self.ids)
        total = self.base_len + int(self.lens.sum())
        return n, (total / n if n else 0.0)

    def delta_df(self, term: str) -> int:
        """Live delta memories holding ``term``."""
        found = self.postings.get(term)
        return 0 if found is None else len(found[0])
