"""The full-text leg: DuckDB FTS (BM25) over memory content.

The tokenizer keeps digits and ``_`` (``ignore`` in settings), so identifiers
such as ``ERR_CONN_RESET``, ``db-17`` or ``JIRA-4412`` become tokens a query
can hit. The FTS index does not follow inserts, so ingest rebuilds it inside
its transaction: a memory is searchable as soon as its ingest returns.
"""

from __future__ import annotations

import threading
import time

import duckdb

from .contracts import Batch, Hit, LegRun
from .scope import Scope, scope_of
from .settings import FulltextSettings


def rebuild_index(con, settings: FulltextSettings) -> None:
    """(Re)create the BM25 index over ``memories.fts_text`` (content, then context).

    PRAGMA arguments cannot be bound; every value comes from validated settings.
    """
    ignore = settings.ignore.replace("'", "''")
    con.execute(
        "PRAGMA create_fts_index('memories', 'id', 'fts_text', "
        f"stemmer='{settings.stemmer}', stopwords='{settings.stopwords}', "
        f"ignore='{ignore}', strip_accents=1, lower=1, overwrite=1)"
    )


# Scope filters are bound parameters; a NULL/empty list disables a filter.
_SEARCH = """
SELECT id, score FROM (
    SELECT m.id, fts_main_memories.match_bm25(m.id, $q, k := $k1, b := $b) AS score
    FROM memories m
    WHERE ($ns IS NULL OR m.namespace = $ns)
      AND (len($types) = 0 OR list_contains($types, m.content_type))
      AND (len($topics) = 0 OR m.id IN (
            SELECT memory_id FROM memory_topics WHERE list_contains($topics, topic_key)))
      AND (len($concepts) = 0 OR m.id IN (
            SELECT memory_id FROM memory_concepts WHERE list_contains($concepts, concept)))
) WHERE score IS NOT NULL
ORDER BY score DESC, id
LIMIT $limit
"""


def search(con, text: str, scope: Scope, limit: int, settings: FulltextSettings) -> list[tuple[str, float]]:
    """Top ``limit`` (id, BM25 score) for ``text`` within ``scope``, best first.

    Ties are broken by id so a ranking is reproducible.
    """
    if not text.strip():
        return []
    params = {
        "q": text,
        "k1": settings.k1,
        "b": settings.b,
        "ns": scope.namespace,
        "types": list(scope.content_types),
        "topics": list(scope.topics),
        "concepts": list(scope.concepts),
        "limit": limit,
    }
    return [(r[0], float(r[1])) for r in con.execute(_SEARCH, params).fetchall()]


def index_exists(con) -> bool:
    return bool(
        con.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'fts_main_memories'"
        ).fetchone()[0]
    )


def search_until(con, text: str, scope: Scope, limit: int, settings: FulltextSettings, deadline: float | None):
    """``search`` that gives up at ``deadline`` (wall clock); returns (hits, timed_out)."""
    if deadline is None:
        return search(con, text, scope, limit, settings), False
    remaining = deadline - time.time()
    if remaining <= 0:
        return [], True
    timer = threading.Timer(remaining, con.interrupt)
    timer.start()
    try:
        return search(con, text, scope, limit, settings), False
    except duckdb.InterruptException:
        return [], True
    finally:
        timer.cancel()


def fulltext_batch(batch: Batch, con, settings: FulltextSettings) -> Batch:
    """The ``search.fulltext`` stage: BM25 for every query of a batch that wants it."""
    has_index = con is not None and index_exists(con)
    for state in batch.states:
        q = state.query
        if not q.wants("fts"):
            state.legs["fts"] = LegRun(leg="fts", ran=False)
            continue
        t0 = time.perf_counter()
        if has_index:
            hits, timed_out = search_until(con, q.text, scope_of(q), q.top_k, settings, q.deadline)
        else:
            hits, timed_out = [], False
        ms = round((time.perf_counter() - t0) * 1000, 3)
        state.legs["fts"] = LegRun(
            leg="fts",
            ran=not timed_out,
            hits=[Hit(id=m, score=s, rank=r) for r, (m, s) in enumerate(hits, start=1)],
            profile={"matched": len(hits), "timed_out": timed_out, "ms": ms},
        )
        state.timings["fulltext"] = ms
    return batch
