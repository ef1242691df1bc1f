"""The vector leg: the seed's beam descent over an in-memory copy of the tree.

``VectorIndex`` holds centroids and leaf members (embeddings ordered by leaf,
so a leaf is one contiguous slice) and is loaded once per process and store
generation: no per-query reads of embeddings, no vector passed to SQL.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.contracts import Batch, Hit, LegRun, Scope
from pipeline.errors import InputError
from pipeline.settings import TreeSettings
from pipeline.store.overlay import Overlay
from pipeline.store.tree import ROOT, namespace_key
from pipeline.timing import ms_since


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
        # The compiled beam's first pass (``descend_kernels.beam``) reads these.
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
        topics = con.execute(
            "SELECT topic_key, parent, is_leaf, centroid FROM topics ORDER BY depth, topic_key"
        ).fetchall()
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
        children = [np.asarray(sorted(c, key=lambda j: keys[j]), dtype=np.int64) for c in kids]

        # Leaf order first (small columns only), then the embeddings in chunks
        # of physical rows, scattered straight into their leaf-ordered place:
        # no sort of the vectors, no per-row Python objects, and peak memory
        # is the matrix plus one chunk (1M x 384: 1.5 GB + 150 MB).
        # Namespace, type and leaf come back as small integer codes computed in
        # SQL, never as per-row Python strings (3M transient strings at 1M
        # memories, whose arenas Python keeps after the load).
        rows = con.execute(
            "WITH ns AS (SELECT namespace, (dense_rank() OVER (ORDER BY namespace) - 1)::INTEGER AS c "
            "            FROM (SELECT DISTINCT namespace FROM memories)), "
            "ct AS (SELECT content_type, (dense_rank() OVER (ORDER BY content_type) - 1)::INTEGER AS c "
            "       FROM (SELECT DISTINCT content_type FROM memories)), "
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
        namespaces = [r[0] for r in con.execute("SELECT DISTINCT namespace FROM memories ORDER BY 1").fetchall()]
        content_types = [r[0] for r in con.execute("SELECT DISTINCT content_type FROM memories ORDER BY 1").fetchall()]
        ns_code = np.asarray(rows["ns"], dtype=np.int32)
        ct_code = np.asarray(rows["ct"], dtype=np.int32)
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
        id_rank = np.asarray(rows["id_rank"], dtype=np.int64)
        return cls(
            generation=generation, ids=ids, emb=emb, id_rank=id_rank,
            namespaces=namespaces, ns_code=ns_code, content_types=content_types, ct_code=ct_code,
            row_leaf=row_leaf, keys=keys, centroids=centroids, parent=parent, is_leaf=is_leaf,
            children=children, leaf_start=leaf_start, leaf_end=leaf_end,
            key_index=key_index, row_of={m: i for i, m in enumerate(ids)},
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


def descend(
    index: VectorIndex,
    query: np.ndarray,
    start: list[int],
    *,
    beam_width: int,
    max_depth: int,
    top_k: int,
    mask: np.ndarray | None = None,
    deadline: float | None = None,
    exclude: np.ndarray | None = None,
) -> tuple[list[tuple[str, float]], dict[str, Any]]:
    """Beam descent (the seed's ``resolve_topics``), then score only reached leaves.

    frontier = start; at each depth the frontier's children are scored against
    the query and the best ``beam_width`` kept (ties broken by topic key); a
    leaf already in the frontier competes with its own score. Stops when the
    frontier is all leaves or at ``max_depth``. Memories scored is at most
    ``beam_width * max_leaf_items``.
    """
    t0 = time.perf_counter()
    profile: dict[str, Any] = {
        "topics_scored": 0, "leaves_reached": 0, "memories_scored": 0, "depth": 0, "timed_out": False,
    }
    query = np.ascontiguousarray(query, dtype=np.float32)
    allowed = index.allowed_topics(mask) if mask is not None else _NONE
    frontier = np.asarray([t for t in start if not len(allowed) or allowed[t]], dtype=np.int64)
    if _COMPILED:
        return _descend_compiled(index, query, frontier, allowed, beam_width, max_depth, top_k,
                                 _NONE if mask is None else mask, _NONE if exclude is None else exclude,
                                 deadline, profile, t0)
    scores = np.full(len(index.keys), np.inf, dtype=np.float32)  # a start topic outranks everything
    step = _beam_numpy
    kept = np.empty(beam_width, dtype=np.int64)
    for depth in range(max_depth):
        if index.is_leaf[frontier].all():
            break
        if deadline is not None and time.time() >= deadline:
            profile["timed_out"] = True
            break
        # the frontier's children scored, then the best beam_width of them and
        # of the frontier's leaves (a leaf competes with its own score; ties go
        # to the smaller key), best first
        n, scored = step(frontier, index.is_leaf, index.child_off, index.child_flat, index.child_centroids,
                         allowed, query, index.key_rank, scores, kept)
        profile["topics_scored"] += int(scored)
        frontier = kept[:n].copy()
        profile["depth"] = depth + 1
    leaves = frontier[index.is_leaf[frontier]]
    profile["leaves_reached"] = len(leaves)
    profile["reached"] = [index.keys[t] for t in leaves.tolist()]
    if not len(leaves) or profile["timed_out"]:
        profile["ms"] = ms_since(t0)
        return [], profile
    hits, scored = _top(index, index.leaf_start[leaves], index.leaf_end[leaves], query, top_k,
                        _NONE if mask is None else mask, _NONE if exclude is None else exclude)
    profile["memories_scored"] = scored
    profile["ms"] = ms_since(t0)
    return hits, profile


def _descend_compiled(index: VectorIndex, query: np.ndarray, frontier: np.ndarray, allowed: np.ndarray,
                      beam_width: int, max_depth: int, top_k: int, mask: np.ndarray,
                      exclude: np.ndarray, deadline: float | None, profile: dict[str, Any],
                      t0: float) -> tuple[list[tuple[str, float]], dict[str, Any]]:
    """``descend`` in one compiled call (``descend_kernels.descend``). The
    deadline is checked before it, where the numpy loop checks it first: the
    whole call is shorter than the deadline's resolution matters for."""
    if deadline is not None and not index.is_leaf[frontier].all() and time.time() >= deadline:
        profile["timed_out"] = True
        profile["reached"] = []
        profile["ms"] = ms_since(t0)
        return [], profile
    leaves = np.empty(max(len(frontier), beam_width), dtype=np.int64)
    rows = np.empty(top_k, dtype=np.int64)
    sims = np.empty(top_k, dtype=np.float32)
    n_leaves, n, topics, scored, depth = _COMPILED[0][1](
        frontier, index.is_leaf, index.child_off, index.child_flat, index.child_centroids, index.child_q8,
        index.child_scale, allowed, query, index.key_rank, beam_width, max_depth, index.leaf_start, index.leaf_end, index.emb, mask, exclude,
        index.id_rank, leaves, rows, sims)
    profile.update(topics_scored=int(topics), depth=int(depth), leaves_reached=int(n_leaves),
                   reached=[index.keys[t] for t in leaves[:n_leaves].tolist()],
                   memories_scored=int(scored))
    hits = [(index.ids[r], float(v)) for r, v in zip(rows[:n].tolist(), sims[:n].tolist(), strict=True)]
    profile["ms"] = ms_since(t0)
    return hits, profile


def exact(index: VectorIndex, query: np.ndarray, scope: Scope, top_k: int, mask: np.ndarray | None = None) -> list[tuple[str, float]]:
    """Exact cosine search within a scope: the reference the descent is measured against."""
    rows = np.arange(index.size)
    if scope.namespace is not None:
        code = index.namespaces.index(scope.namespace) if scope.namespace in index.namespaces else -1
        rows = rows[index.ns_code[rows] == code]
    if mask is not None:
        rows = rows[mask[rows]]
    if not len(rows):
        return []
    cut = np.flatnonzero(np.diff(rows) != 1) + 1  # the rows as runs of consecutive rows
    starts = rows[np.concatenate([[0], cut])]
    ends = rows[np.concatenate([cut - 1, [len(rows) - 1]])] + 1
    return _top(index, starts, ends, np.ascontiguousarray(query, dtype=np.float32), top_k, _NONE, _NONE)[0]


def _top(index: VectorIndex, starts: np.ndarray, ends: np.ndarray, query: np.ndarray, top_k: int,
         mask: np.ndarray, exclude: np.ndarray) -> tuple[list[tuple[str, float]], int]:
    """The best ``top_k`` rows of the ranges [starts, ends) (ties by id) and how many were scored."""
    rows = np.empty(top_k, dtype=np.int64)
    sims = np.empty(top_k, dtype=np.float32)
    top = _COMPILED[0][0] if _COMPILED else _top_numpy
    n, scored = top(index.emb, np.asarray(starts, np.int64), np.asarray(ends, np.int64), query, mask, exclude,
                    index.id_rank, rows, sims)
    return [(index.ids[r], float(v)) for r, v in zip(rows[:n].tolist(), sims[:n].tolist(), strict=True)], int(scored)


# -- the loops: numpy, or compiled once compile_kernels() ran in this process ------
# Both keep the same candidates in the same order (best first; ties to the
# smaller topic key or memory id), tested against each other on trees full of
# exact ties. Compiled, the whole descent is one call (one dispatch, not one
# per depth). Compiling costs a process about 1.5 s (numba's import and its
# cache): worth it for a worker or an evaluation answering thousands of
# queries (the descent at 100k: 0.7 ms in numpy, 0.23 ms compiled a call per
# depth, BENCHMARKS.md for one call), not for a one-shot ``dimple search``,
# which keeps numpy.
_NONE = np.zeros(0, dtype=bool)  # "no mask"
_COMPILED: list[tuple[Any, Any]] = []  # (top, descend)


def compile_kernels() -> None:
    """From now on this process descends with the compiled loops
    (``pipeline.stages.descend_kernels``), compiled or loaded from numba's
    cache now rather than on a query. Search workers call it at start, and
    so do embedded evaluations; a long-lived embedded caller may too."""
    if _COMPILED:
        return
    try:
        from pipeline.stages import descend_kernels

        loops = (descend_kernels.top, descend_kernels.descend)
        _run_once(loops)
    except Exception as exc:  # noqa: BLE001  (numba absent or broken, no writable cache: numpy answers the same)
        logging.getLogger("dimple.descend").warning("the descent keeps its numpy loops: numba failed (%s)", exc)
        return
    _COMPILED.append(loops)


def _run_once(loops: tuple[Any, Any]) -> None:
    """Each loop once on a tiny index, which compiles it (or loads it from the cache)."""
    index = VectorIndex(
        generation=0, ids=["a"], emb=np.ones((1, 2), np.float32), id_rank=np.zeros(1, np.int64),
        namespaces=["n"], ns_code=np.zeros(1, np.int32), content_types=["t"], ct_code=np.zeros(1, np.int32),
        row_leaf=np.ones(1, np.int64), keys=[ROOT, "n"], centroids=np.ones((2, 2), np.float32),
        parent=np.array([-1, 0]), is_leaf=np.array([False, True]), children=[np.array([1]), np.zeros(0, np.int64)],
        leaf_start=np.array([0, 0]), leaf_end=np.array([0, 1]),
    )
    loops[0](index.emb, np.zeros(1, np.int64), np.ones(1, np.int64), np.ones(2, np.float32), _NONE, np.ones(1, bool),
             index.id_rank, np.zeros(1, np.int64), np.zeros(1, np.float32))
    loops[1](np.zeros(1, np.int64), index.is_leaf, index.child_off, index.child_flat, index.child_centroids,
             index.child_q8, index.child_scale, _NONE, np.ones(2, np.float32), index.key_rank, 1, 2, index.leaf_start,
             index.leaf_end, index.emb, _NONE, _NONE, index.id_rank, np.zeros(1, np.int64), np.zeros(1, np.int64),
             np.zeros(1, np.float32))


def _beam_numpy(frontier, is_leaf, child_off, child_flat, child_centroids, allowed, q, key_rank, topic_scores, out):
    """``descend_kernels.beam`` in numpy: every candidate sorted."""
    leaf = is_leaf[frontier]
    spans = [np.arange(child_off[t], child_off[t + 1]) for t in frontier[~leaf]]
    at = np.concatenate(spans) if spans else np.zeros(0, np.int64)
    if len(allowed):
        at = at[allowed[child_flat[at]]]
    kids = child_flat[at]
    topic_scores[kids] = child_centroids[at] @ q
    candidates = np.concatenate([frontier[leaf], kids])
    best = candidates[np.lexsort((key_rank[candidates], -topic_scores[candidates]))[: len(out)]]
    out[: len(best)] = best
    return len(best), len(kids)


def _top_numpy(emb, starts, ends, q, mask, exclude, id_rank, out_rows, out_sims):
    """``descend_kernels.top`` in numpy: a partition, then a sort of the rows tied with the k-th."""
    spans = [np.arange(a, b) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
    rows = np.concatenate(spans) if spans else np.zeros(0, np.int64)
    if len(mask):
        rows = rows[mask[rows]]
    if len(exclude):
        rows = rows[~exclude[rows]]
    if not len(rows):
        return 0, 0
    sims = emb[rows] @ q
    k = len(out_rows)
    part = np.arange(len(rows))
    if len(rows) > k:
        kth = sims[np.argpartition(-sims, k - 1)[:k]].min()
        part = np.flatnonzero(sims >= kth)  # every row tied with the k-th, so ties go by id exactly
    chosen = part[np.lexsort((id_rank[rows[part]], -sims[part]))[:k]]
    out_rows[: len(chosen)] = rows[chosen]
    out_sims[: len(chosen)] = sims[chosen]
    return len(chosen), len(rows)


def descend_batch(batch: Batch, index: VectorIndex | None, con, tree: TreeSettings,
                  overlay: Overlay | None = None) -> Batch:
    """The ``search.descend`` stage: the vector leg for every query of a batch.

    With deltas (``overlay``) the base's beam descent skips dead rows and the
    live delta memories in scope are scored exactly; one ranking, ties by id.
    """
    live = overlay is not None and not overlay.empty
    for state in batch.states:
        q = state.query
        if "vector" in state.legs:  # already decided upstream (deadline)
            continue
        if not q.wants("vector"):
            state.legs["vector"] = LegRun(leg="vector", ran=False)
            continue
        t0 = time.perf_counter()
        hits: list[tuple[str, float]]
        profile: dict[str, Any]
        if q.vector is not None and index is not None and len(q.vector) != index.emb.shape[1]:
            raise InputError("vector", f"{len(q.vector)} dimensions; the store's embeddings have {index.emb.shape[1]}")
        if index is None or index.size == 0 or q.vector is None:
            hits, profile = [], {"topics_scored": 0, "leaves_reached": 0, "memories_scored": 0, "timed_out": False}
        else:
            scope = q.scope
            hits, profile = descend(
                index,
                np.asarray(q.vector, dtype=np.float32),
                index.start_topics(scope),
                beam_width=tree.beam_width,
                max_depth=tree.max_depth,
                top_k=q.top_k,
                mask=index.row_mask(con, scope),
                deadline=q.deadline,
                exclude=overlay.dead_rows(index) if live and overlay is not None else None,
            )
        if live and overlay is not None and q.vector is not None and not profile.get("timed_out", False):
            extra = overlay.vector_hits(np.asarray(q.vector, dtype=np.float32), q.scope, q.top_k)
            profile["delta_memories_scored"] = len(overlay.ids)
            hits = sorted(hits + extra, key=lambda h: (-h[1], h[0]))[: q.top_k]
        state.legs["vector"] = LegRun(
            leg="vector",
            ran=not profile.get("timed_out", False),
            hits=[Hit(id=m, score=s, rank=r) for r, (m, s) in enumerate(hits, start=1)],
            profile=profile,
        )
        state.timings["descend"] = ms_since(t0)
    return batch
