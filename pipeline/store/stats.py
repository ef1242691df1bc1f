"""``dimple stats``: what is in a store, and whether its index is fresh."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pipeline.store.database import Store, one
from pipeline.store.fulltext import index_exists
from pipeline.store.overlay import Overlay


def store_stats(store: Store, overlay: Overlay | None = None) -> dict[str, Any]:
    """What the store holds as a query reads it: the base with the pending
    deltas (``overlay``) merged in, as the next compaction would write it.
    The topic tree is the base's (deltas are routed to its leaves)."""
    con = store.con
    by_ns = Counter(dict(con.execute("SELECT namespace, count(*) FROM memories GROUP BY 1").fetchall()))
    by_type = Counter(dict(con.execute("SELECT content_type, count(*) FROM memories GROUP BY 1").fetchall()))
    edges = set(con.execute("SELECT DISTINCT src, dst, kind, origin FROM edges").fetchall())
    if overlay is not None and not overlay.empty:
        dead = con.execute("SELECT namespace, content_type FROM memories WHERE id IN (SELECT unnest(?))",
                           [sorted(overlay.dead_ids)]).fetchall()
        by_ns.subtract(ns for ns, _ in dead)
        by_type.subtract(kind for _, kind in dead)
        by_ns.update(m.namespace for m in overlay.members.values())
        by_type.update(m.content_type for m in overlay.members.values())
        # a delta voids the edges its memories declared in the base (as augment reads them)
        edges = {e for e in edges if e[3] not in overlay.touched}
        edges |= {(s, d, k, m.id) for m in overlay.members.values() for s, d, k in m.edges()}
    by_ns, by_type = +by_ns, +by_type  # drops namespaces and types left with no memory
    # only live edges count: a link to or from a forgotten memory is gone at once (SECURITY.md)
    ends = sorted({e[0] for e in edges} | {e[1] for e in edges})
    in_base = store.existing_ids(ends)
    live = overlay.live_ids(ends, in_base) if overlay is not None else in_base
    edges = {e for e in edges if e[0] in live and e[1] in live}
    by_kind = Counter(kind for _, _, kind in {(s, d, k) for s, d, k, _ in edges})
    tree = one(
        con,
        "SELECT coalesce(max(depth), 0), count(*) FILTER (WHERE is_leaf), coalesce(max(size) FILTER (WHERE is_leaf), 0), "
        "count(*) FROM topics",
    )
    placed = one(con, "SELECT count(DISTINCT memory_id) FROM memory_topics WHERE kind = 'leaf'")[0]
    generation = store.generation
    fts_generation = int(store.meta("fts_generation", "0") or 0)
    base_total = store.count()
    total = sum(by_ns.values())
    return {
        "path": str(store.path),
        "schema_version": store.info.schema_version,
        "embedding_model": store.info.embedding_model,
        "embedding_dim": store.info.embedding_dim,
        "generation": generation,
        "memories": total,
        "namespaces": len(by_ns),
        "by_namespace": dict(sorted(by_ns.items())),
        "by_content_type": dict(sorted(by_type.items())),
        "edges": dict(sorted(by_kind.items())),
        "tree": {
            "topics": tree[3],
            "depth": tree[0],
            "leaves": tree[1],
            "largest_leaf": tree[2],
            "memories_in_leaves": placed,
        },
        "fts": {
            "exists": index_exists(con),
            "fresh": base_total == 0 or (index_exists(con) and fts_generation == generation),
            "built_at_generation": fts_generation,
        },
    }
