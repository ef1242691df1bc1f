"""``dimple stats``: what is in a store, and whether its index is fresh."""

from __future__ import annotations

from typing import Any

from pipeline.store.database import Store, one
from pipeline.store.fulltext_index import index_exists


def store_stats(store: Store) -> dict[str, Any]:
    con = store.con
    by_ns = con.execute("SELECT namespace, count(*) FROM memories GROUP BY 1 ORDER BY 1").fetchall()
    by_type = con.execute("SELECT content_type, count(*) FROM memories GROUP BY 1 ORDER BY 1").fetchall()
    tree = one(
        con,
        "SELECT coalesce(max(depth), 0), count(*) FILTER (WHERE is_leaf), coalesce(max(size) FILTER (WHERE is_leaf), 0), "
        "count(*) FROM topics",
    )
    placed = one(con, "SELECT count(DISTINCT memory_id) FROM memory_topics WHERE kind = 'leaf'")[0]
    edges = con.execute("SELECT kind, count(*) FROM edges GROUP BY 1 ORDER BY 1").fetchall()
    generation = store.generation
    fts_generation = int(store.meta("fts_generation", "0") or 0)
    total = store.count()
    return {
        "path": str(store.path),
        "schema_version": store.info.schema_version,
        "embedding_model": store.info.embedding_model,
        "embedding_dim": store.info.embedding_dim,
        "generation": generation,
        "memories": total,
        "namespaces": len(by_ns),
        "by_namespace": dict(by_ns),
        "by_content_type": dict(by_type),
        "edges": dict(edges),
        "tree": {
            "topics": tree[3],
            "depth": tree[0],
            "leaves": tree[1],
            "largest_leaf": tree[2],
            "memories_in_leaves": placed,
        },
        "fts": {
            "exists": index_exists(con),
            "fresh": total == 0 or (index_exists(con) and fts_generation == generation),
            "built_at_generation": fts_generation,
        },
    }
