"""The memory graph as a query reads it: memories (id, namespace, type,
created, content, topics, concepts) and the typed edges between them, from
the base and the deltas over it, read on demand for one batch's candidates.

What the base holds is read through ``BaseGraph``, which keeps what it read
for the life of the base (a published base never changes; a new one gets a
new ``BaseGraph``): a query whose candidates an earlier query read costs no
SQL (each DuckDB statement costs 0.2-4 ms, even on a store of 398 memories).
"""

from __future__ import annotations

import threading
from collections import defaultdict

from pipeline.store.database import rows_by_ids
from pipeline.store.overlay import Overlay

# {id}, {memory_id}, {src}, {dst}: "that column is one of the ids", from
# pipeline.store.database.rows_by_ids (index lookups for one query's candidates).
_ROWS = "SELECT id, namespace, content_type, created_at, content FROM memories WHERE {id}"
_TOPICS = "SELECT memory_id, topic_key FROM memory_topics WHERE {memory_id} ORDER BY 1, 2"
_CONCEPTS = "SELECT memory_id, concept FROM memory_concepts WHERE {memory_id} ORDER BY 1, 2"
# the declaring memory too: a delta voids the edges its memories declared in the base
_EDGES = "SELECT DISTINCT src, dst, kind, origin FROM edges WHERE {dst} OR (kind = 'conflicts' AND {src})"

# How many memories a BaseGraph keeps at most (the oldest read go first): the
# candidates of a hundred or more queries, bounded whatever the store's size
# (tens of MB per search process at a few hundred characters of content each).
BASE_GRAPH_MEMORIES = 20_000

Row = tuple  # (id, namespace, content_type, created_at, content)
Memory = tuple[Row, tuple[str, ...], tuple[str, ...]]  # row, topic keys sorted, concepts sorted
Edge = tuple[str, str, str, str]  # src, dst, kind, origin


class BaseGraph:
    """What ``Graph`` reads of one base, kept once read (thread-safe): each
    memory's row, topics and concepts, and the edges touching it (those that
    end at it, and the ``conflicts`` edges that start at it). At most
    ``capacity`` memories are kept of each, the oldest read going first."""

    def __init__(self, capacity: int = BASE_GRAPH_MEMORIES) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._memories: dict[str, Memory | None] = {}  # None: not in the base
        self._edges: dict[str, tuple[Edge, ...]] = {}

    def memories(self, con, ids: list[str]) -> dict[str, Memory]:
        """The base's memories among ``ids`` (those it does not hold are left out)."""
        found, missing = self._known(self._memories, ids)
        if missing:
            rows: dict[str, Row] = {r[0]: r for r in rows_by_ids(con, _ROWS, missing)}
            topics: dict[str, list[str]] = defaultdict(list)
            concepts: dict[str, list[str]] = defaultdict(list)
            if rows:
                held = sorted(rows)
                for mid, key in rows_by_ids(con, _TOPICS, held):
                    topics[mid].append(key)
                for mid, concept in rows_by_ids(con, _CONCEPTS, held):
                    concepts[mid].append(concept)
            fresh = {m: (rows[m], tuple(topics[m]), tuple(concepts[m])) if m in rows else None for m in missing}
            self._keep(self._memories, fresh)
            found.update(fresh)
        return {m: hit for m, hit in found.items() if hit is not None}

    def edges(self, con, ids: list[str]) -> set[Edge]:
        """The base's edges that end at one of ``ids``, and its ``conflicts``
        edges that start at one, with the memory that declared each (``origin``)."""
        found, missing = self._known(self._edges, ids)
        if missing:
            fresh: dict[str, list[Edge]] = {m: [] for m in missing}
            for src, dst, kind, origin in rows_by_ids(con, _EDGES, missing):
                edge = (src, dst, kind, origin)
                if dst in fresh:
                    fresh[dst].append(edge)
                if kind == "conflicts" and src in fresh and src != dst:
                    fresh[src].append(edge)
            kept = {m: tuple(v) for m, v in fresh.items()}
            self._keep(self._edges, kept)
            found.update(kept)
        return {e for group in found.values() for e in group}

    def _known(self, known: dict, ids: list[str]) -> tuple[dict, list[str]]:
        """What ``known`` holds of ``ids``, and the rest (sorted), read under the
        lock: the SQL for the rest runs outside it, so threads do not queue on it."""
        with self._lock:
            found = {m: known[m] for m in ids if m in known}
        return found, sorted({m for m in ids if m not in found})

    def _keep(self, known: dict, fresh: dict) -> None:
        with self._lock:
            known.update(fresh)
            while len(known) > self.capacity:
                del known[next(iter(known))]


class Graph:
    """The memories and typed edges one ``search.augment`` call reads
    (``pipeline.stages.augment.Graph`` adds the links it shows), read on
    demand (``load``) from the base (through ``base``, kept across calls
    when the caller keeps it: ``pipeline.store.reader.View.graph``) and the
    deltas over it: a memory a delta replaced or forgot is never read from
    the base, and a forgotten one is in neither ``rows`` nor any link."""

    def __init__(self, con, overlay: Overlay | None = None, base: BaseGraph | None = None):
        self.con = con
        self.base = base if base is not None else BaseGraph()
        self.live = overlay if overlay is not None and not overlay.empty else None
        self.rows: dict[str, tuple] = {}  # id -> (id, namespace, content_type, created_at, content)
        self.topics: dict[str, list[str]] = defaultdict(list)
        self.concepts: dict[str, list[str]] = defaultdict(list)
        self.links: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        self._edges_read: set[str] = set()
        self._rows_read: set[str] = set()

    def loaded(self, mid: str) -> bool:
        """Whether ``mid``'s edges (so its whole graph context) have been read."""
        return mid in self._edges_read

    def load(self, ids) -> None:
        """Read the edges touching ``ids`` and the memories at both ends."""
        new = sorted(set(ids) - self._edges_read)
        if new:
            self._edges_read.update(new)
            for src, dst, kind in self._live_edges(new):
                if kind == "supersedes":
                    self.links[dst]["superseded_by"].add(src)
                elif kind == "supports":
                    self.links[dst]["supported_by"].add(src)
                elif kind == "conflicts":
                    self.links[dst]["conflicts"].add(src)
                    self.links[src]["conflicts"].add(dst)
        linked = {m for i in new for group in self.links.get(i, {}).values() for m in group}
        self._read_rows(set(new) | linked)

    def _live_edges(self, wanted: list[str]) -> set[tuple[str, str, str]]:
        """Edges touching ``wanted``: the base's, less those a delta voided (their
        declaring memory was rewritten or forgotten, or a forget cut them on the
        lake: ``Overlay.unlinked``), plus those delta memories declare."""
        live = self.live
        base = self.base.edges(self.con, wanted) if self.con is not None else set()
        if live is None:
            return {(s, d, k) for s, d, k, _ in base}
        want = set(wanted)
        return {(s, d, k) for s, d, k, origin in base
                if origin not in live.touched and (s, d, k, origin) not in live.unlinked} | {
            (s, d, k) for m in live.members.values() for s, d, k in live.linked(m.id, m.edges())
            if d in want or (k == "conflicts" and s in want)
        }

    def _read_rows(self, ids: set[str]) -> None:
        new = sorted(ids - self._rows_read)
        if not new:
            return
        self._rows_read.update(new)
        live = self.live
        from_base = new if live is None else [m for m in new if m not in live.touched]
        if from_base and self.con is not None:
            for mid, (row, topics, concepts) in self.base.memories(self.con, from_base).items():
                self.rows[mid] = row
                self.topics[mid] = list(topics)
                self.concepts[mid] = list(concepts)
        if live is not None:
            for mid in new:
                m = live.members.get(mid)
                if m is not None:
                    self.rows[mid] = (mid, m.namespace, m.content_type, m.created_at, m.content)
                    self.topics[mid] = m.all_topics
                    self.concepts[mid] = sorted(m.concepts)

    def superseded_by(self, mid: str) -> list[str]:
        """The live memories that supersede ``mid`` (its edges must be loaded)."""
        links = self.links.get(mid)
        group = links.get("superseded_by") if links else None
        return sorted(m for m in group if m in self.rows) if group else []  # most candidates: none

    def created_at(self, mid: str):
        return self.rows[mid][3]
