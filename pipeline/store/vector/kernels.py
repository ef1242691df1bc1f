"""The beam descent's loops, compiled by numba;
``pipeline.store.vector.descent.Kernels.compile`` imports this module (search
workers at start, embedded evaluations), until then the descent runs the
same loops in numpy.

``beam`` scores a frontier's children and keeps the best ``beam_width`` of
them and of the frontier's leaves; ``top`` scores leaf rows and keeps the best
``top_k``; ``descend`` runs both, depth by depth, in one call. ``beam`` and
``top`` keep a sorted buffer of the best so far (best first, ties to the
smaller rank: topic key or memory id) instead of sorting every candidate,
and read centroids and rows where they lie, with no gathered copy. Dot
products are float32, summed in the order the compiler vectorises (as a BLAS
kernel would). Compiled code is cached on disk beside this file (or in
numba's user cache when that is read-only).
"""

from __future__ import annotations

import numba
import numpy as np

_jit = numba.njit(cache=True, nogil=True, fastmath=True)
# below any score and above any, and finite: fastmath lets the compiler assume no infinities
_BELOW = -1e300
_TOP = np.float32(3.4e38)
# ``beam`` screens children in int8 first when there are this many times more
# than it keeps: keeping a larger share, most would be scored twice
_SCREEN_FROM = 4


@_jit
def _dot(mat, i, q):
    """Row ``i`` of ``mat`` (float32, or int8 for the screen) dotted with ``q``, in float32."""
    s = np.float32(0.0)
    for j in range(q.shape[0]):
        s += np.float32(mat[i, j]) * q[j]
    return s


@_jit
def _keep(item, score, rank, items, scores, ranks, n, cap):
    """Insert ``item`` into the best-first buffer of ``n`` if it makes the best ``cap``; returns the new n."""
    if n == cap and (score < scores[n - 1] or (score == scores[n - 1] and rank > ranks[n - 1])):
        return n
    i = n if n < cap else cap - 1
    while i > 0 and (scores[i - 1] < score or (scores[i - 1] == score and ranks[i - 1] > rank)):
        items[i] = items[i - 1]
        scores[i] = scores[i - 1]
        ranks[i] = ranks[i - 1]
        i -= 1
    items[i] = item
    scores[i] = score
    ranks[i] = rank
    return n + 1 if n < cap else n


@_jit
def _push(lows, low):
    """Insert ``low`` into the best-first buffer ``lows`` (full, padded with ``_BELOW``) if it makes it."""
    j = lows.shape[0] - 1
    if low <= lows[j]:
        return
    while j > 0 and lows[j - 1] < low:
        lows[j] = lows[j - 1]
        j -= 1
    lows[j] = low


@_jit
def _margin(scale, reach):
    """How far a child's int8 score may be from its float32 one (``VectorIndex.__post_init__``)."""
    return scale * reach + 1e-30


@_jit
def beam(frontier, is_leaf, child_off, child_flat, child_centroids, child_q8, child_scale, allowed, q, reach,
         key_rank, topic_scores, out):
    """One depth of the descent: ``out[:n]`` the next frontier, best first;
    returns (n, topics scored). A leaf of the frontier competes with its
    score from ``topic_scores``; each child scored in float32 is written there.

    With ``_SCREEN_FROM`` times more children than ``out`` holds, a first
    pass scores them against their int8 copies (a quarter of the bytes: the
    top level of an unscoped query is every namespace's top topics, read
    from memory on each query) with a bound on the error, and only a child
    whose upper bound reaches the ``len(out)``-th best lower bound is scored
    again in float32 and competes: the same children are kept, in the same
    order, as when every one is scored in float32
    (``VectorIndex.__post_init__`` has the bound)."""
    cap = out.shape[0]
    best = np.empty(cap, np.float32)
    ranks = np.empty(cap, np.int64)
    n = 0
    scored = 0
    m = 0
    for t in frontier:
        if not is_leaf[t]:
            m += child_off[t + 1] - child_off[t]
    screen = m > _SCREEN_FROM * cap
    floor = _BELOW
    approx = np.empty(m if screen else 0, np.float64)
    if screen:
        lows = np.full(cap, _BELOW)  # the best cap lower bounds, best first
        i = 0
        for t in frontier:
            if is_leaf[t]:
                _push(lows, np.float64(topic_scores[t]))
                continue
            for c in range(child_off[t], child_off[t + 1]):
                if allowed.shape[0] and not allowed[child_flat[c]]:
                    i += 1  # never read: the second pass skips it too
                    continue
                approx[i] = np.float64(_dot(child_q8, c, q)) * child_scale[c]
                _push(lows, approx[i] - _margin(child_scale[c], reach))
                i += 1
        floor = lows[cap - 1]
    i = 0
    for t in frontier:
        if is_leaf[t]:
            n = _keep(t, topic_scores[t], key_rank[t], out, best, ranks, n, cap)
            continue
        for c in range(child_off[t], child_off[t + 1]):
            kid = child_flat[c]
            if allowed.shape[0] and not allowed[kid]:
                i += 1
                continue
            scored += 1
            if screen:
                near = approx[i] + _margin(child_scale[c], reach) >= floor
                i += 1
                if not near:
                    continue
            s = _dot(child_centroids, c, q)
            topic_scores[kid] = s
            n = _keep(kid, s, key_rank[kid], out, best, ranks, n, cap)
    return n, scored


@_jit
def top(emb, starts, ends, q, mask, exclude, id_rank, out_rows, out_sims):
    """The best ``len(out_rows)`` rows of the ranges [starts, ends) outside
    ``exclude`` and inside ``mask`` (empty: no mask), best first; returns
    (n, rows scored)."""
    cap = out_rows.shape[0]
    ranks = np.empty(cap, np.int64)
    n = 0
    scored = 0
    for r in range(starts.shape[0]):
        for i in range(starts[r], ends[r]):
            if (mask.shape[0] and not mask[i]) or (exclude.shape[0] and exclude[i]):
                continue
            scored += 1
            n = _keep(i, _dot(emb, i, q), id_rank[i], out_rows, out_sims, ranks, n, cap)
    return n, scored


@_jit
def descend(start, is_leaf, child_off, child_flat, child_centroids, child_q8, child_scale, allowed, q, key_rank,
            beam_width, max_depth, leaf_start, leaf_end, emb, mask, exclude, id_rank, out_leaves, out_rows, out_sims):
    """The whole descent in one call (``beam`` at each depth, then ``top``
    over the leaves reached), so a query pays one call's dispatch instead of
    one per depth: ``out_leaves[:l]`` the leaves reached in frontier order,
    ``out_rows[:n]``/``out_sims[:n]`` the best rows; returns (l, n, topics
    scored, memories scored, depth)."""
    frontier = start.copy()
    kept = np.empty(beam_width, np.int64)
    # read only where written: a start topic's (above every score), a child's once scored
    topic_scores = np.empty(is_leaf.shape[0], np.float32)
    for t in start:
        topic_scores[t] = _TOP
    # a child's int8 score is within child_scale * reach of its float32 one
    # (``VectorIndex.__post_init__``)
    q_l1 = 0.0
    for j in range(q.shape[0]):
        q_l1 += abs(np.float64(q[j]))
    reach = q_l1 * (0.5 + 2.0 * 127.0 * q.shape[0] * 2.0 ** -23)
    scored = 0
    depth = 0
    for d in range(max_depth):
        all_leaves = True
        for t in frontier:
            if not is_leaf[t]:
                all_leaves = False
                break
        if all_leaves:
            break
        n, s = beam(frontier, is_leaf, child_off, child_flat, child_centroids, child_q8, child_scale, allowed, q, reach,
                    key_rank, topic_scores, kept)
        scored += s
        frontier = kept[:n].copy()
        depth = d + 1
    n_leaves = 0
    for t in frontier:
        if is_leaf[t]:
            out_leaves[n_leaves] = t
            n_leaves += 1
    if n_leaves == 0:
        return 0, 0, scored, 0, depth
    starts = np.empty(n_leaves, np.int64)
    ends = np.empty(n_leaves, np.int64)
    for i in range(n_leaves):
        starts[i] = leaf_start[out_leaves[i]]
        ends[i] = leaf_end[out_leaves[i]]
    n, rows_scored = top(emb, starts, ends, q, mask, exclude, id_rank, out_rows, out_sims)
    return n_leaves, n, scored, rows_scored, depth
