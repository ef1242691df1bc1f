"""The memory graph as a query reads it: memories (id, namespace, type,
created, content, topics, concepts) and the typed edges between them, from
the base and the deltas over it, read on demand for one batch's candidates.
"""

from __future__ import annotations

from collections import defaultdict

from pipeline.store.database import rows_by_ids
from pipeline.store.overlay import Overlay

# {id}, {memory_id}, {src}, {dst}: "that column is one of the ids", from
# pipeline.store.database.rows_by_ids (index lookups for one query's candidates).
_ROWS = "SELECT id, namespace, content_type, created_at, content FROM memories WHERE {id}"
_TOPICS = "SELECT memory_id, topic_key FROM memory_topics WHERE {memory_id} ORDER BY 1, 2"
_CONCEPTS = "SELECT memory_id, concept FROM memory_concepts WHERE {memory_id} ORDER BY 1, 2"
_EDGES = "SELECT DISTINCT src, dst, kind FROM edges WHERE {dst} OR (kind = 'conflicts' AND {src}) ORDER BY 1, 2, 3"
# with deltas: the declaring memory too, since a delta voids the edges its memories declared in the base
_EDGES_BY_ORIGIN = "SELECT DISTINCT src, dst, kind, origin FROM edges WHERE {dst} OR (kind = 'conflicts' AND {src})"


def _live_edges(con, wanted: list[str], overlay: Overlay) -> list[tuple[str, str, str]]:
    """Edges touching ``wanted``: the base's, less those a delta voided (their
    declaring memory was rewritten or forgotten, or a forget cut them on the
    lake: ``Overlay.unlinked``), plus those delta memories declare."""
    base = [(s, d, k) for s, d, k, origin in rows_by_ids(con, _EDGES_BY_ORIGIN, wanted)
            if origin not in overlay.touched and (s, d, k, origin) not in overlay.unlinked]
    want = set(wanted)
    delta = [
        (s, d, k) for m in overlay.members.values() for s, d, k in overlay.linked(m.id, m.edges())
        if d in want or (k == "conflicts" and s in want)
    ]
    return sorted(set(base) | set(delta))


class Graph:
    """The memories and typed edges one ``search.augment`` call reads
    (``pipeline.stages.augment.Graph`` adds the links it shows), read on
    demand (``load``) from the base and the deltas over it: a memory a delta
    replaced or forgot is never read from the base, and a forgotten one is in
    neither ``rows`` nor any link."""

    def __init__(self, con, overlay: Overlay | None = None):
        self.con = con
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
            edges = rows_by_ids(self.con, _EDGES, new) if self.live is None else _live_edges(self.con, new, self.live)
            for src, dst, kind in edges:
                if kind == "supersedes":
                    self.links[dst]["superseded_by"].add(src)
                elif kind == "supports":
                    self.links[dst]["supported_by"].add(src)
                elif kind == "conflicts":
                    self.links[dst]["conflicts"].add(src)
                    self.links[src]["conflicts"].add(dst)
        linked = {m for i in new for group in self.links.get(i, {}).values() for m in group}
        self._read_rows(set(new) | linked)

    def _read_rows(self, ids: set[str]) -> None:
        new = sorted(ids - self._rows_read)
        if not new:
            return
        self._rows_read.update(new)
        live = self.live
        from_base = new if live is None else [m for m in new if m not in live.touched]
        if from_base and self.con is not None:
            self.rows.update((r[0], r) for r in rows_by_ids(self.con, _ROWS, from_base))
            for mid, key in rows_by_ids(self.con, _TOPICS, from_base):
                self.topics[mid].append(key)
            for mid, concept in rows_by_ids(self.con, _CONCEPTS, from_base):
                self.concepts[mid].append(concept)
        if live is not None:
            for mid in new:
                m = live.members.get(mid)
                if m is not None:
                    self.rows[mid] = (mid, m.namespace, m.content_type, m.created_at, m.content)
                    self.topics[mid] = m.all_topics
                    self.concepts[mid] = sorted(m.concepts)

    def superseded_by(self, mid: str) -> list[str]:
        """The live memories that supersede ``mid`` (its edges must be loaded)."""
        return sorted(m for m in self.links.get(mid, {}).get("superseded_by", ()) if m in self.rows)

    def created_at(self, mid: str):
        return self.rows[mid][3]
