"""The vector index: one base's tree and embeddings in memory, loaded once
per process and base (``VectorIndex.load``), or opened from the host cache
(``pipeline.store.hostcache``: ``read_parts`` written once per host as
``.npy`` files, memory-mapped by every process, ``from_parts``).

``VectorIndex`` holds centroids and leaf members (embeddings ordered by leaf,
so a leaf is one contiguous slice), their scope codes and the tie-break
ranks: no per-query reads of embeddings, no vector passed to SQL. The
descent over it is ``pipeline.store.vector.descent``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.contracts import Scope
from pipeline.store.database import LABEL_CODES, label_lists
from pipeline.store.vector.tree import ROOT, namespace_key, topic_rows


@dataclass
class VectorIndex:
    generation: int
    ids: list[str]
    emb: np.ndarray  # (N, d) float32, rows grouped by leaf
    id_rank: np.ndarray  # rank of each row's id in sorted order, for tie-breaks
    namespaces: list[str]
    ns_code: np.ndarray  # (N,) index into namespaces
    content_types: list[str]
    ct_code: np.ndarray  # (N,) index into content_types
    row_leaf: np.ndarray  # (N,) topic index of each row's leaf
    keys: list[str]  # topic keys; index 0 is the root
    centroids: np.ndarray  # (T, d)
    parent: np.ndarray  # (T,) topic index of the parent, -1 for the root
    is_leaf: np.ndarray  # (T,) bool
    children: list[np.ndarray]  # per topic: child topic indices sorted by key
    leaf_start: np.ndarray  # (T,) first row of a leaf (0 for internal topics)
    leaf_end: np.ndarray  # (T,) one past the last row of a leaf
    key_index: dict[str, int] = field(default_factory=dict)
    row_of: dict[str, int] = field(default_factory=dict)
    key_rank: np.ndarray = field(init=False)  # (T,) rank of each topic key, for tie-breaks
    child_off: np.ndarray = field(init=False)  # (T+1,) topic t's children: child_flat[child_off[t]:child_off[t+1]]
    child_flat: np.ndarray = field(init=False)  # every topic's children, parent by parent
    child_centroids: np.ndarray = field(init=False)  # (len(child_flat), d) their centroids, in that order
    child_q8: np.ndarray = field(init=False)  # the same as int8, row i ~ child_scale[i] * child_q8[i]
    child_scale: np.ndarray = field(init=False)  # (len(child_flat),) float32: max |centroid entry| / 127

    def __post_init__(self) -> None:
        self.key_rank = np.empty(len(self.keys), dtype=np.int64)
        self.key_rank[sorted(range(len(self.keys)), key=self.keys.__getitem__)] = np.arange(len(self.keys))
        # every topic's children side by side, with their centroids in the
        # same order: a beam step reads contiguous rows, gathers nothing
        counts = np.asarray([len(c) for c in self.children], dtype=np.int64)
        self.child_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.child_flat = (np.concatenate(self.children).astype(np.int64) if counts.sum()
                           else np.zeros(0, np.int64))
        self.child_centroids = np.ascontiguousarray(self.centroids[self.child_flat], dtype=np.float32)
        # The compiled beam's first pass (``kernels.beam``) reads these.
        # Each entry is within scale / 2 of the centroid's, so a child's int8
        # score is within scale / 2 * |q|_1 of its exact one; each of the two
        # float32 sums (d products) adds at most d * 2**-24 * 127 * scale * |q|_1
        # (the bound on a dot product's rounding in any summation order): the
        # kernel's margin, scale * |q|_1 * (0.5 + 2 * 127 * d * 2**-23), holds
        # both with a factor 2 to spare.
        peak = np.abs(self.child_centroids).max(axis=1) if len(self.child_flat) else np.zeros(0, np.float32)
        self.child_scale = (peak / 127).astype(np.float32)
        safe = np.where(self.child_scale > 0, self.child_scale, 1).astype(np.float64)[:, None]
        self.child_q8 = np.clip(np.rint(self.child_centroids / safe), -127, 127).astype(np.int8)

    @property
    def size(self) -> int:
        return len(self.ids)

    @classmethod
    def load(cls, con, generation: int, dim: int) -> VectorIndex:
        """The index of the base ``con`` reads (``read_parts``)."""
        return cls.from_parts(generation, *read_parts(con, dim))

    @classmethod
    def from_parts(cls, generation: int, arrays: dict[str, np.ndarray], lists: dict[str, list]) -> VectorIndex:
        """The index from what ``read_parts`` gives (or the host cache holds:
        ``pipeline.store.hostcache``); the arrays are used as they are (a
        read-only memory map stays one)."""
        keys, ids = lists["keys"], lists["ids"]
        child_off = arrays["child_off"]
        children = [arrays["child_flat"][child_off[t]:child_off[t + 1]] for t in range(len(keys))]
        return cls(
            generation=generation, ids=ids, emb=arrays["emb"], id_rank=arrays["id_rank"],
            namespaces=list(lists["namespaces"]), ns_code=arrays["ns_code"],
            content_types=list(lists["content_types"]), ct_code=arrays["ct_code"],
            row_leaf=arrays["row_leaf"], keys=keys, centroids=arrays["centroids"], parent=arrays["parent"],
            is_leaf=arrays["is_leaf"], children=children, leaf_start=arrays["leaf_start"],
            leaf_end=arrays["leaf_end"], key_index={k: i for i, k in enumerate(keys)},
            row_of={m: i for i, m in enumerate(ids)},
        )

    def nbytes(self) -> int:
        """Bytes held by the arrays (Python ids and the id lookup not counted)."""
        arrays = [self.emb, self.id_rank, self.ns_code, self.ct_code, self.row_leaf, self.centroids,
                  self.parent, self.is_leaf, self.leaf_start, self.leaf_end, self.key_rank, self.child_off,
                  self.child_flat, self.child_centroids, self.child_q8, self.child_scale]
        return sum(a.nbytes for a in arrays) + sum(c.nbytes for c in self.children)

    # -- scope --------------------------------------------------------------
    def row_mask(self, con, scope: Scope) -> np.ndarray | None:
        """Rows inside ``scope`` (None when nothing beyond the namespace filters)."""
        if not (scope.content_types or scope.topics or scope.concepts):
            return None
        mask = np.ones(self.size, dtype=bool)
        if scope.content_types:
            codes = [self.content_types.index(c) for c in scope.content_types if c in self.content_types]
            mask &= np.isin(self.ct_code, codes)
        if scope.topics:
            mask &= self._rows_in(con, "SELECT DISTINCT memory_id FROM memory_topics WHERE list_contains(?, topic_key)", list(scope.topics))
        if scope.concepts:
            mask &= self._rows_in(con, "SELECT DISTINCT memory_id FROM memory_concepts WHERE list_contains(?, concept)", list(scope.concepts))
        return mask

    def _rows_in(self, con, sql: str, values: list[str]) -> np.ndarray:
        out = np.zeros(self.size, dtype=bool)
        rows = [self.row_of[r[0]] for r in con.execute(sql, [values]).fetchall() if r[0] in self.row_of]
        out[rows] = True
        return out

    def allowed_topics(self, mask: np.ndarray) -> np.ndarray:
        """Topics with at least one allowed row below them."""
        allowed = np.zeros(len(self.keys), dtype=bool)
        frontier = np.unique(self.row_leaf[mask])
        while len(frontier):
            frontier = frontier[~allowed[frontier]]
            allowed[frontier] = True
            frontier = np.unique(self.parent[frontier])
            frontier = frontier[frontier >= 0]
        return allowed

    def start_topics(self, scope: Scope) -> list[int]:
        """Where the descent starts: the scope's namespace, or every namespace.

        Namespaces are partitions, not topics: their centroids say nothing a
        beam should choose by (one conversation's centroid against another's),
        so an unscoped query starts at all of them and the beam's first cut is
        among their topics, as if the root's children were every namespace's
        top-level topics.
        """
        if scope.namespace is None:
            return self.children[0].tolist()
        key = namespace_key(scope.namespace)
        return [self.key_index[key]] if key in self.key_index else []


def read_parts(con, dim: int) -> tuple[dict[str, np.ndarray], dict[str, list]]:
    """What a ``VectorIndex`` of the base ``con`` reads is made of: its arrays
    (``emb`` by leaf, ``id_rank``, scope codes, ``row_leaf``, the tree as
    ``centroids``, ``parent``, ``is_leaf``, leaf bounds, and every topic's
    children as ``child_flat`` sliced by ``child_off``) and its lists of
    strings (``ids``, ``namespaces``, ``content_types``, topic ``keys``)."""
    topics = topic_rows(con, "SELECT topic_key, parent, is_leaf, centroid FROM topics ORDER BY depth, topic_key")
    if not topics or topics[0][0] != ROOT:
        topics = [(ROOT, None, False, None)] + [t for t in topics if t[0] != ROOT]
    keys = [t[0] for t in topics]
    key_index = {k: i for i, k in enumerate(keys)}
    T = len(keys)
    centroids = np.zeros((T, dim), dtype=np.float32)
    parent = np.full(T, -1, dtype=np.int64)
    is_leaf = np.zeros(T, dtype=bool)
    kids: list[list[int]] = [[] for _ in range(T)]
    for i, (_key, par, leaf, centroid) in enumerate(topics):
        if centroid is not None:
            centroids[i] = centroid
        is_leaf[i] = bool(leaf)
        if par is not None and par in key_index:
            parent[i] = key_index[par]
            kids[parent[i]].append(i)
    children = [sorted(c, key=lambda j: keys[j]) for c in kids]
    child_off = np.concatenate([[0], np.cumsum([len(c) for c in children], dtype=np.int64)]).astype(np.int64)
    child_flat = np.asarray([j for c in children for j in c], dtype=np.int64)

    # Leaf order first (small columns only), then the embeddings in chunks
    # of physical rows, scattered straight into their leaf-ordered place:
    # no sort of the vectors, no per-row Python objects, and peak memory
    # is the matrix plus one chunk (1M x 384: 1.5 GB + 150 MB).
    # Namespace, type and leaf come back as small integer codes computed in
    # SQL, never as per-row Python strings (3M transient strings at 1M
    # memories, whose arenas Python keeps after the load).
    rows = con.execute(
        f"WITH {LABEL_CODES}, "
        "tk AS (SELECT topic_key, (row_number() OVER (ORDER BY topic_key) - 1)::INTEGER AS c FROM topics) "
        "SELECT m.rowid AS r, m.id, ns.c AS ns, ct.c AS ct, tk.c AS leaf, "
        "(row_number() OVER (ORDER BY m.id) - 1) AS id_rank "
        "FROM memories m JOIN memory_topics mt ON mt.memory_id = m.id AND mt.kind = 'leaf' "
        "JOIN ns USING (namespace) JOIN ct USING (content_type) JOIN tk ON tk.topic_key = mt.topic_key "
        "ORDER BY mt.topic_key, m.id"
    ).fetchnumpy()
    ids = rows["id"].tolist()
    del rows["id"]
    n = len(ids)
    emb = _embeddings_in_order(con, rows["r"], dim)
    namespaces, content_types = label_lists(con)
    sorted_keys = [r[0] for r in con.execute("SELECT topic_key FROM topics ORDER BY topic_key").fetchall()]
    to_index = np.asarray([key_index[k] for k in sorted_keys], dtype=np.int64)
    row_leaf = to_index[np.asarray(rows["leaf"], dtype=np.int64)] if n else np.zeros(0, np.int64)
    leaf_start = np.zeros(T, dtype=np.int64)
    leaf_end = np.zeros(T, dtype=np.int64)
    if n:
        change = np.flatnonzero(np.diff(row_leaf)) + 1
        starts = np.concatenate([[0], change])
        ends = np.concatenate([change, [n]])
        leaf_start[row_leaf[starts]] = starts
        leaf_end[row_leaf[starts]] = ends
    arrays = {"emb": emb, "id_rank": np.asarray(rows["id_rank"], dtype=np.int64),
              "ns_code": np.asarray(rows["ns"], dtype=np.int32), "ct_code": np.asarray(rows["ct"], dtype=np.int32),
              "row_leaf": row_leaf, "centroids": centroids, "parent": parent, "is_leaf": is_leaf,
              "leaf_start": leaf_start, "leaf_end": leaf_end, "child_off": child_off, "child_flat": child_flat}
    return arrays, {"ids": ids, "namespaces": namespaces, "content_types": content_types, "keys": keys}


_CHUNK_ROWS = 65_536


def _embeddings_in_order(con, rowids: np.ndarray, dim: int) -> np.ndarray:
    """Embeddings of the memories at ``rowids``, in that order, read by ranges of rowid."""
    n = len(rowids)
    out = np.empty((n, dim), dtype=np.float32)
    if not n:
        return out
    rowids = np.asarray(rowids, dtype=np.int64)
    position = np.full(int(rowids.max()) + 1, -1, dtype=np.int64)
    position[rowids] = np.arange(n)
    for start in range(0, len(position), _CHUNK_ROWS):
        stop = start + _CHUNK_ROWS
        got = con.execute(
            "SELECT rowid AS r FROM memories WHERE rowid >= ? AND rowid < ? ORDER BY rowid", [start, stop]
        ).fetchnumpy()["r"]
        flat = con.execute(
            "SELECT unnest(embedding) AS v FROM (SELECT rowid AS r, embedding FROM memories "
            "WHERE rowid >= ? AND rowid < ? ORDER BY rowid)", [start, stop]
        ).fetchnumpy()["v"]
        pos = position[np.asarray(got, dtype=np.int64)]
        block = np.asarray(flat, dtype=np.float32).reshape(len(got), dim)
        keep = pos >= 0  # rows without a leaf (none in a consistent store) are left out
        if keep.all():
            out[pos] = block
        else:
            out[pos[keep]] = block[keep]
    return out
