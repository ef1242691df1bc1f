"""The memory graph as a query reads it: memories (id, namespace, type,
created, content, topics, concepts) and the typed edges between them, from
the base and the deltas over it, read on demand for one batch's candidates.

What the base holds is read through ``BaseGraph``. Where the base has a
folder in the host cache (``pipeline.store.hostcache``), its graph is a part
there (``GraphPart``: every memory's row, topics and concepts, and the edges,
as arrays sorted by id, memory-mapped): a query's candidates are looked up in
it, whatever the store's size. DuckDB answers "these 150 ids" with a scan of
the whole table (no ART index serves an ``IN`` list): 30-45 ms a query at
100,000 memories for the four statements, where the part takes well under a
millisecond. Without one, ``BaseGraph`` reads by SQL and keeps what it read
for the life of the base (a published base never changes; a new one gets a
new ``BaseGraph``): a query whose candidates an earlier query read costs no
SQL (each DuckDB statement costs 0.2-4 ms, even on a store of 398 memories).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta

import numpy as np

from pipeline.store.database import LABEL_CODES, label_lists, rows_by_ids
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


_EPOCH = datetime(1970, 1, 1)  # created_at is a TIMESTAMP (UTC, naive), as DuckDB returns it
# The edge kinds a part codes (``edges.kind``); another kind in a base is refused when the part is read.
EDGE_KINDS = ("conflicts", "supersedes", "supports")
# Memories per statement when a part reads the contents (physical row ranges: no sort of the contents).
PART_CHUNK = 50_000

Parts = tuple[dict[str, np.ndarray], dict[str, list]]


def _utf8(values) -> np.ndarray:
    """Strings as one fixed-width bytes array (UTF-8: byte order is code point order, as DuckDB sorts)."""
    return np.array([v.encode("utf-8") for v in values], dtype=bytes)


def _codes(con, sql: str) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in con.execute(sql).fetchnumpy().items()}


def read_parts(con, chunk: int = PART_CHUNK) -> Parts:
    """What a ``GraphPart`` of the base ``con`` is made of: the memories by
    id (``ids``, UTF-8, sorted; ``ns`` and ``ct`` codes into the lists
    ``namespaces`` and ``content_types``; ``created_us`` since the epoch; the
    contents as one UTF-8 ``content`` array sliced by ``content_start`` /
    ``content_end``), their topic keys and concepts (codes into ``topics`` and
    ``concepts``, sorted, sliced by ``topic_off`` / ``concept_off``), and the
    distinct edges sorted by ``edge_dst`` with their ``edge_src``,
    ``edge_kind`` (into ``EDGE_KINDS``) and ``edge_origin``, and the
    ``conflicts`` edges' positions sorted by source (``conflict_by_src``,
    their sources in that order: ``conflict_src``).
    Strings come back from DuckDB once each; per-row values as codes."""
    rows = _codes(con, f"""
        WITH {LABEL_CODES}
        SELECT m.id AS id, m.rowid AS r, ns.c AS ns, ct.c AS ct, epoch_us(m.created_at) AS us
        FROM memories m JOIN ns USING (namespace) JOIN ct USING (content_type) ORDER BY m.id""")
    ids = [str(i) for i in rows["id"].tolist()]
    namespaces, content_types = label_lists(con)
    rowids = rows["r"].astype(np.int64)
    # the contents in physical order, each row's slice found by its rowid
    size = int(rowids.max(initial=-1)) + 1
    start_of = np.zeros(size, dtype=np.int64)
    end_of = np.zeros(size, dtype=np.int64)
    pieces: list[bytes] = []
    at = 0
    for lo in range(0, size, chunk):
        for rowid, content in con.execute("SELECT rowid, content FROM memories WHERE rowid >= ? AND rowid < ?",
                                          [lo, lo + chunk]).fetchall():
            data = content.encode("utf-8")
            start_of[rowid], end_of[rowid] = at, at + len(data)
            pieces.append(data)
            at += len(data)
    content = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    del pieces
    listed: dict[str, list] = {"namespaces": namespaces, "content_types": content_types}
    arrays: dict[str, np.ndarray] = {
        "ids": _utf8(ids), "ns": rows["ns"].astype(np.int32), "ct": rows["ct"].astype(np.int32),
        "created_us": rows["us"].astype(np.int64), "content": content,
        "content_start": start_of[rowids], "content_end": end_of[rowids]}
    for name, table, column in (("topic", "memory_topics", "topic_key"), ("concept", "memory_concepts", "concept")):
        listed[f"{name}s"] = [r[0] for r in con.execute(f"SELECT DISTINCT {column} FROM {table} ORDER BY 1").fetchall()]
        got = _codes(con, f"""
            WITH m AS (SELECT id, (row_number() OVER (ORDER BY id) - 1)::BIGINT AS r FROM memories),
                 v AS (SELECT {column}, (dense_rank() OVER (ORDER BY {column}) - 1)::INTEGER AS c
                       FROM (SELECT DISTINCT {column} FROM {table}))
            SELECT m.r AS r, v.c AS c FROM {table} t JOIN m ON m.id = t.memory_id JOIN v USING ({column})
            ORDER BY 1, 2""")
        counts = np.bincount(got["r"].astype(np.int64), minlength=len(ids)) if len(got["r"]) else np.zeros(len(ids), np.int64)
        arrays[f"{name}_off"] = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        arrays[f"{name}_code"] = got["c"].astype(np.int32)
    edges = con.execute("SELECT DISTINCT dst, src, kind, origin FROM edges ORDER BY dst, src, kind, origin").fetchall()
    unknown = {e[2] for e in edges} - set(EDGE_KINDS)
    if unknown:
        raise ValueError(f"edges of unknown kinds {sorted(unknown)}: a graph part codes {EDGE_KINDS}")
    arrays["edge_dst"] = _utf8(e[0] for e in edges)
    arrays["edge_src"] = _utf8(e[1] for e in edges)
    arrays["edge_kind"] = np.array([EDGE_KINDS.index(e[2]) for e in edges], dtype=np.int8)
    arrays["edge_origin"] = _utf8(e[3] for e in edges)
    conflicts = np.flatnonzero(arrays["edge_kind"] == EDGE_KINDS.index("conflicts"))
    arrays["conflict_by_src"] = conflicts[np.argsort(arrays["edge_src"][conflicts], kind="stable")].astype(np.int64)
    arrays["conflict_src"] = arrays["edge_src"][arrays["conflict_by_src"]]
    return arrays, listed


class GraphPart:
    """A base's graph as the host cache maps it (``read_parts``): the
    memories and edges of any ids in a few array lookups each (binary search
    over the sorted ids), read-only, shared by threads."""

    def __init__(self, arrays: dict[str, np.ndarray], lists: dict[str, list]):
        self.a, self.lists = arrays, lists

    @staticmethod
    def _find(sorted_values: np.ndarray, wanted: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Where each of ``wanted`` is in ``sorted_values``: its first and one past its last position."""
        keys = [w.encode("utf-8") for w in wanted]
        width = sorted_values.dtype.itemsize if len(sorted_values) else 0
        # a key wider than the array is in none of its values (numpy would cut it to the width)
        fits = np.array([0 < len(k) <= width for k in keys], dtype=bool)
        lo = np.zeros(len(keys), dtype=np.int64)
        hi = np.zeros(len(keys), dtype=np.int64)
        if fits.any():
            probe = np.array([k for k, ok in zip(keys, fits, strict=True) if ok], dtype=sorted_values.dtype)
            lo[fits] = np.searchsorted(sorted_values, probe, side="left")
            hi[fits] = np.searchsorted(sorted_values, probe, side="right")
        return lo, hi

    def memories(self, ids: list[str]) -> dict[str, Memory]:
        """The base's memories among ``ids`` (those it does not hold are left out), as ``BaseGraph`` gives them."""
        a, lists = self.a, self.lists
        lo, hi = self._find(a["ids"], ids)
        held = lo < hi
        at = lo[held]
        if not len(at):
            return {}
        # each column gathered once for every memory found, then Python values (no numpy scalar per field)
        ns, ct, us = a["ns"][at].tolist(), a["ct"][at].tolist(), a["created_us"][at].tolist()
        start, end = a["content_start"][at].tolist(), a["content_end"][at].tolist()
        t0, t1 = a["topic_off"][at].tolist(), a["topic_off"][at + 1].tolist()
        c0, c1 = a["concept_off"][at].tolist(), a["concept_off"][at + 1].tolist()
        content, topic_code, concept_code = a["content"].data, a["topic_code"], a["concept_code"]
        names, types, topics, concepts = lists["namespaces"], lists["content_types"], lists["topics"], lists["concepts"]
        out: dict[str, Memory] = {}
        for k, mid in enumerate(m for m, h in zip(ids, held.tolist(), strict=True) if h):
            row = (mid, names[ns[k]], types[ct[k]], _EPOCH + timedelta(microseconds=us[k]),
                   str(content[start[k]:end[k]], "utf-8"))
            out[mid] = (row, tuple(topics[c] for c in topic_code[t0[k]:t1[k]].tolist()) if t1[k] > t0[k] else (),
                        tuple(concepts[c] for c in concept_code[c0[k]:c1[k]].tolist()) if c1[k] > c0[k] else ())
        return out

    def edges(self, ids: list[str]) -> dict[str, tuple[Edge, ...]]:
        """Each of ``ids``'s edges in the base: those that end at it, and the
        ``conflicts`` edges that start at it (at another memory), each with the
        memory that declared it."""
        a = self.a
        fresh: dict[str, list[Edge]] = {m: [] for m in ids}
        if not len(a["edge_dst"]):
            return {m: () for m in ids}

        def edge(k: int) -> Edge:
            return (a["edge_src"][k].decode("utf-8"), a["edge_dst"][k].decode("utf-8"),
                    EDGE_KINDS[a["edge_kind"][k]], a["edge_origin"][k].decode("utf-8"))

        lo, hi = self._find(a["edge_dst"], ids)
        for mid, i, j in zip(ids, lo.tolist(), hi.tolist(), strict=True):
            fresh[mid].extend(edge(k) for k in range(i, j))
        by_src = a["conflict_by_src"]
        if len(by_src):
            lo, hi = self._find(a["conflict_src"], ids)
            for mid, i, j in zip(ids, lo.tolist(), hi.tolist(), strict=True):
                fresh[mid].extend(e for e in (edge(int(k)) for k in by_src[i:j]) if e[0] != e[1])
        return {m: tuple(v) for m, v in fresh.items()}


class BaseGraph:
    """What ``Graph`` reads of one base (thread-safe): each memory's row,
    topics and concepts, and the edges touching it (those that end at it, and
    the ``conflicts`` edges that start at it). From the base's ``GraphPart``
    where ``part`` gives one; else by SQL, kept once read: at most
    ``capacity`` memories of each, the oldest read going first."""

    def __init__(self, capacity: int = BASE_GRAPH_MEMORIES,
                 part: Callable[[], GraphPart | None] | None = None) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        # oldest read first: dropping it is O(1) (a plain dict's first key, after many dropped before
        # it, is found by walking their empty slots: 0.4 ms a query at 100,000 memories)
        self._memories: OrderedDict[str, Memory | None] = OrderedDict()  # None: not in the base
        self._edges: OrderedDict[str, tuple[Edge, ...]] = OrderedDict()
        self._part = part

    def part(self) -> GraphPart | None:
        """The base's graph part (read or mapped on first use), None without one."""
        return self._part() if self._part is not None else None

    def memories(self, con, ids: list[str]) -> dict[str, Memory]:
        """The base's memories among ``ids`` (those it does not hold are left out)."""
        found, missing = self._known(self._memories, ids)
        if missing:
            part = self.part()
            read = part.memories(missing) if part is not None else self._read_memories(con, missing)
            fresh = {m: read.get(m) for m in missing}
            self._keep(self._memories, fresh)
            found.update(fresh)
        return {m: hit for m, hit in found.items() if hit is not None}

    @staticmethod
    def _read_memories(con, ids: list[str]) -> dict[str, Memory]:
        rows: dict[str, Row] = {r[0]: r for r in rows_by_ids(con, _ROWS, ids)}
        topics: dict[str, list[str]] = defaultdict(list)
        concepts: dict[str, list[str]] = defaultdict(list)
        if rows:
            held = sorted(rows)
            for mid, key in rows_by_ids(con, _TOPICS, held):
                topics[mid].append(key)
            for mid, concept in rows_by_ids(con, _CONCEPTS, held):
                concepts[mid].append(concept)
        return {m: (row, tuple(topics[m]), tuple(concepts[m])) for m, row in rows.items()}

    def edges(self, con, ids: list[str]) -> set[Edge]:
        """The base's edges that end at one of ``ids``, and its ``conflicts``
        edges that start at one, with the memory that declared each (``origin``)."""
        found, missing = self._known(self._edges, ids)
        if missing:
            part = self.part()
            kept = part.edges(missing) if part is not None else self._read_edges(con, missing)
            self._keep(self._edges, kept)
            found.update(kept)
        return {e for group in found.values() for e in group}

    @staticmethod
    def _read_edges(con, ids: list[str]) -> dict[str, tuple[Edge, ...]]:
        fresh: dict[str, list[Edge]] = {m: [] for m in ids}
        for src, dst, kind, origin in rows_by_ids(con, _EDGES, ids):
            edge = (src, dst, kind, origin)
            if dst in fresh:
                fresh[dst].append(edge)
            if kind == "conflicts" and src in fresh and src != dst:
                fresh[src].append(edge)
        return {m: tuple(v) for m, v in fresh.items()}

    def _known(self, known: dict, ids: list[str]) -> tuple[dict, list[str]]:
        """What ``known`` holds of ``ids``, and the rest (sorted), read under the
        lock: the SQL for the rest runs outside it, so threads do not queue on it."""
        with self._lock:
            found = {m: known[m] for m in ids if m in known}
        return found, sorted({m for m in ids if m not in found})

    def _keep(self, known: OrderedDict, fresh: dict) -> None:
        with self._lock:
            known.update(fresh)
            while len(known) > self.capacity:
                known.popitem(last=False)


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
