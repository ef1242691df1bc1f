"""Searching the vector index: the seed's beam descent (``descend``), exact
search within a scope (``exact``, the reference the descent is measured
against) and exact scoring of the deltas' memories (``delta_hits``).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.contracts import Scope
from pipeline.store.vector.index import VectorIndex
from pipeline.store.vector.tree import ROOT
from pipeline.timing import ms_since

if TYPE_CHECKING:  # annotations only: the overlay imports the full-text package, not this one
    from pipeline.store.overlay import Overlay

_NONE = np.zeros(0, dtype=bool)  # "no mask"


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
    kernels: Kernels | None = None,
    trace: list[list[tuple[str, float]]] | None = None,
) -> tuple[list[tuple[str, float]], dict[str, Any]]:
    """Beam descent (the seed's ``resolve_topics``), then score only reached leaves.

    frontier = start; at each depth the frontier's children are scored against
    the query and the best ``beam_width`` kept (ties broken by topic key); a
    leaf already in the frontier competes with its own score. Stops when the
    frontier is all leaves or at ``max_depth``. Memories scored is at most
    ``beam_width * max_leaf_items``. ``kernels``: the loops (this process's by default).

    ``trace`` (a list) gets, per depth, every candidate the beam ranked there as
    (topic key, centroid score), best first, the first ``beam_width`` being
    those it kept (a start topic scores ``inf``): what ``pipeline.audit.whynot``
    reads to say where a memory's leaf fell out of the beam. A traced descent
    runs the numpy loops (the compiled ones keep the same candidates in the
    same order, and rank none beyond the beam).
    """
    kernels = kernels if kernels is not None else KERNELS
    t0 = time.perf_counter()
    profile: dict[str, Any] = {
        "topics_scored": 0, "leaves_reached": 0, "memories_scored": 0, "depth": 0, "timed_out": False,
    }
    query = np.ascontiguousarray(query, dtype=np.float32)
    allowed = index.allowed_topics(mask) if mask is not None else _NONE
    frontier = np.asarray([t for t in start if not len(allowed) or allowed[t]], dtype=np.int64)
    if kernels.compiled is not None and trace is None:
        return _descend_compiled(kernels.compiled[1], index, query, frontier, allowed, beam_width, max_depth, top_k,
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
        ranked: list[np.ndarray] | None = [] if trace is not None else None
        n, scored = step(frontier, index.is_leaf, index.child_off, index.child_flat, index.child_centroids,
                         allowed, query, index.key_rank, scores, kept, ranked)
        if trace is not None and ranked:
            trace.append([(index.keys[t], float(scores[t])) for t in ranked[0].tolist()])
        profile["topics_scored"] += int(scored)
        frontier = kept[:n].copy()
        profile["depth"] = depth + 1
    leaves = frontier[index.is_leaf[frontier]]
    profile["leaves_reached"] = len(leaves)
    profile["reached"] = [index.keys[t] for t in leaves.tolist()]
    if not len(leaves) or profile["timed_out"]:
        profile["ms"] = ms_since(t0)
        return [], profile
    hits, scored = _top(kernels, index, index.leaf_start[leaves], index.leaf_end[leaves], query, top_k,
                        _NONE if mask is None else mask, _NONE if exclude is None else exclude)
    profile["memories_scored"] = scored
    profile["ms"] = ms_since(t0)
    return hits, profile


def _descend_compiled(loop: Any, index: VectorIndex, query: np.ndarray, frontier: np.ndarray, allowed: np.ndarray,
                      beam_width: int, max_depth: int, top_k: int, mask: np.ndarray,
                      exclude: np.ndarray, deadline: float | None, profile: dict[str, Any],
                      t0: float) -> tuple[list[tuple[str, float]], dict[str, Any]]:
    """``descend`` in one compiled call (``loop``: ``kernels.descend``). The
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
    n_leaves, n, topics, scored, depth = loop(
        frontier, index.is_leaf, index.child_off, index.child_flat, index.child_centroids, index.child_q8,
        index.child_scale, allowed, query, index.key_rank, beam_width, max_depth, index.leaf_start, index.leaf_end, index.emb, mask, exclude,
        index.id_rank, leaves, rows, sims)
    profile.update(topics_scored=int(topics), depth=int(depth), leaves_reached=int(n_leaves),
                   reached=[index.keys[t] for t in leaves[:n_leaves].tolist()],
                   memories_scored=int(scored))
    hits = [(index.ids[r], float(v)) for r, v in zip(rows[:n].tolist(), sims[:n].tolist(), strict=True)]
    profile["ms"] = ms_since(t0)
    return hits, profile


def exact(index: VectorIndex, query: np.ndarray, scope: Scope, top_k: int, mask: np.ndarray | None = None,
          kernels: Kernels | None = None) -> list[tuple[str, float]]:
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
    return _top(kernels if kernels is not None else KERNELS, index, starts, ends,
                np.ascontiguousarray(query, dtype=np.float32), top_k, _NONE, _NONE)[0]


def _top(kernels: Kernels, index: VectorIndex, starts: np.ndarray, ends: np.ndarray, query: np.ndarray, top_k: int,
         mask: np.ndarray, exclude: np.ndarray) -> tuple[list[tuple[str, float]], int]:
    """The best ``top_k`` rows of the ranges [starts, ends) (ties by id) and how many were scored."""
    rows = np.empty(top_k, dtype=np.int64)
    sims = np.empty(top_k, dtype=np.float32)
    n, scored = kernels.top(index.emb, np.asarray(starts, np.int64), np.asarray(ends, np.int64), query, mask, exclude,
                    index.id_rank, rows, sims)
    return [(index.ids[r], float(v)) for r, v in zip(rows[:n].tolist(), sims[:n].tolist(), strict=True)], int(scored)


# -- the loops: numpy, or compiled once a process's Kernels.compile() ran ------
# Both keep the same candidates in the same order (best first; ties to the
# smaller topic key or memory id), tested against each other on trees full of
# exact ties. Compiled, the whole descent is one call (one dispatch, not one
# per depth). Compiling costs a process about 1.5 s (numba's import and its
# cache): worth it for a worker or an evaluation answering thousands of
# queries (the descent at 100k: 0.7 ms in numpy, 0.23 ms compiled a call per
# depth, BENCHMARKS.md for one call), not for a one-shot ``dimple search``,
# which keeps numpy.
class Kernels:
    """The descent's loops: numpy until ``compile`` succeeds, then the
    compiled ones (``pipeline.store.vector.kernels``)."""

    def __init__(self) -> None:
        self.compiled: tuple[Any, Any] | None = None  # (top, descend)

    def compile(self) -> None:
        """From now on these kernels descend with the compiled loops, compiled
        or loaded from numba's cache now rather than on a query. Search workers
        call it at start (``compile_kernels``), and so do embedded evaluations;
        a long-lived embedded caller may too."""
        if self.compiled is not None:
            return
        try:
            # imported here, not above: numba's import costs a process about 1.5 s
            from pipeline.store.vector import kernels

            loops = (kernels.top, kernels.descend)
            _run_once(loops)
        except Exception as exc:  # noqa: BLE001  (numba absent or broken, no writable cache: numpy answers the same)
            logging.getLogger("dimple.descend").warning("the descent keeps its numpy loops: numba failed (%s)", exc)
            return
        self.compiled = loops

    @property
    def top(self) -> Any:
        return self.compiled[0] if self.compiled is not None else _top_numpy


# this process's kernels, the default of every descent
KERNELS = Kernels()


def compile_kernels() -> None:
    """This process descends with the compiled loops from now on (``Kernels.compile``)."""
    KERNELS.compile()


def _run_once(loops: tuple[Any, Any]) -> None:
    """Each loop once on a tiny index, which compiles it (or loads it from the
    cache); twice: numba compiles apart for read-only arrays, which an index
    memory-mapped from the host cache holds (``pipeline.store.hostcache``)."""
    for read_only in (False, True):
        _run_on_tiny_index(loops, read_only)


def _run_on_tiny_index(loops: tuple[Any, Any], read_only: bool) -> None:
    index = VectorIndex(
        generation=0, ids=["a"], emb=np.ones((1, 2), np.float32), id_rank=np.zeros(1, np.int64),
        namespaces=["n"], ns_code=np.zeros(1, np.int32), content_types=["t"], ct_code=np.zeros(1, np.int32),
        row_leaf=np.ones(1, np.int64), keys=[ROOT, "n"], centroids=np.ones((2, 2), np.float32),
        parent=np.array([-1, 0]), is_leaf=np.array([False, True]), children=[np.array([1]), np.zeros(0, np.int64)],
        leaf_start=np.array([0, 0]), leaf_end=np.array([0, 1]),
    )
    if read_only:  # the arrays the host cache maps (VectorIndex.from_parts keeps them as they are)
        for array in (index.emb, index.id_rank, index.is_leaf, index.leaf_start, index.leaf_end):
            array.setflags(write=False)
    loops[0](index.emb, np.zeros(1, np.int64), np.ones(1, np.int64), np.ones(2, np.float32), _NONE, np.ones(1, bool),
             index.id_rank, np.zeros(1, np.int64), np.zeros(1, np.float32))
    loops[1](np.zeros(1, np.int64), index.is_leaf, index.child_off, index.child_flat, index.child_centroids,
             index.child_q8, index.child_scale, _NONE, np.ones(2, np.float32), index.key_rank, 1, 2, index.leaf_start,
             index.leaf_end, index.emb, _NONE, _NONE, index.id_rank, np.zeros(1, np.int64), np.zeros(1, np.int64),
             np.zeros(1, np.float32))


def _beam_numpy(frontier, is_leaf, child_off, child_flat, child_centroids, allowed, q, key_rank, topic_scores, out,
                ranked=None):
    """``kernels.beam`` in numpy: every candidate sorted (appended to ``ranked``, a list, when given)."""
    leaf = is_leaf[frontier]
    spans = [np.arange(child_off[t], child_off[t + 1]) for t in frontier[~leaf]]
    at = np.concatenate(spans) if spans else np.zeros(0, np.int64)
    if len(allowed):
        at = at[allowed[child_flat[at]]]
    kids = child_flat[at]
    topic_scores[kids] = child_centroids[at] @ q
    candidates = np.concatenate([frontier[leaf], kids])
    order = candidates[np.lexsort((key_rank[candidates], -topic_scores[candidates]))]
    if ranked is not None:
        ranked.append(order)
    best = order[: len(out)]
    out[: len(best)] = best
    return len(best), len(kids)


def _top_numpy(emb, starts, ends, q, mask, exclude, id_rank, out_rows, out_sims):
    """``kernels.top`` in numpy: a partition, then a sort of the rows tied with the k-th."""
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


def delta_hits(overlay: Overlay, query: np.ndarray, scope: Scope, top_k: int) -> list[tuple[str, float]]:
    """Exact cosine over the overlay's live delta memories in scope, best first, ties by id."""
    if not overlay.ids:
        return []
    rows = np.flatnonzero(overlay.rows_in(scope))
    if not len(rows):
        return []
    sims = overlay.emb[rows] @ query
    if len(rows) > top_k:  # rows tied with the k-th score stay, so ties break by id exactly
        kth = np.partition(-sims, top_k - 1)[top_k - 1]
        keep = np.flatnonzero(-sims <= kth)
        rows, sims = rows[keep], sims[keep]
    order = sorted(range(len(rows)), key=lambda i: (-float(sims[i]), overlay.ids[rows[i]]))[:top_k]
    return [(overlay.ids[rows[i]], float(sims[i])) for i in order]
