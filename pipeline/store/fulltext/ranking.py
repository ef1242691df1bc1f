"""Full-text search: BM25 over a term-ordered postings table, cost bounded by
the postings of the query's terms, not by the number of memories; the base
and the deltas over it scored as one corpus.

The DuckDB FTS extension builds the index (tokenizer, Porter stemmer,
stopwords; ``fts_main_memories``: ``dict``, ``terms``, ``docs``, ``stats``),
but its ``match_bm25(id, q)`` is a macro evaluated for every row of the table
it is called on: a full scan, whose cost grows with the store. So
``pipeline.store.fulltext.index`` derives, from the extension's own tables,
one posting list per term, and ``search`` reads only the lists of the query's
terms: from process memory, where a query process holds the base's postings
(``pipeline.store.fulltext.postings``, read once per base), or by primary key in SQL
(topic and concept scopes, and callers without the postings).

Scores are the extension's (``pipeline.store.fulltext.bm25``): the query is
tokenized with the index's own ``tokenize`` macro, its stopwords dropped and
the rest stemmed with the index's stemmer, as the index treats a memory's
text (``pipeline.store.fulltext.terms``; ``match_bm25`` stems a query's
stopwords instead, and "at", the stem of "ate", then matches every memory
that says "ate"); each distinct term counts once (a repeated query term does
not weigh more; unknown terms are absent from ``dict`` and score nothing).

With deltas (``pipeline.store.overlay``) N, avgdl and each term's df are the
live corpus's (base minus dead memories, plus the deltas'), the base's dead
memories are skipped and the deltas' memories are scored from their stored
terms (``delta_hits``), so scores equal BM25 over the merged corpus, as a
compaction would index it.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import duckdb
import numpy as np

from pipeline.contracts import Scope
from pipeline.settings import FulltextSettings
from pipeline.store.database import placeholders
from pipeline.store.fulltext.bm25 import bm25, bm25_sql
from pipeline.store.fulltext.postings import Postings
from pipeline.store.fulltext.terms import query_terms

if TYPE_CHECKING:  # annotations only: the overlay imports this package's index
    from pipeline.store.overlay import Overlay

# A query is three short statements, each with a small plan: its terms (the
# index's own tokenizer and stemmer), their ids (point lookups in fts_terms'
# primary key), then BM25 over the posting lists of exactly those term ids
# (point lookups in fts_postings' primary key, then unnest): the rows read
# are the query terms' postings, with no floor of a row group per term (a
# term-ordered flat table read through zone maps cost ~123k rows per term).
# Scope filters apply to those postings before the top-k; each is a fixed SQL fragment with bound parameters, included only
# when the query sets it (a disabled "$x IS NULL OR ..." filter would still
# build its subquery's join on every query). Term and filter placeholders
# are generated names; no user text is ever part of the SQL.
_TERM_IDS = "SELECT termid FROM fts_terms WHERE term IN ({terms})"

# {df}, {n}, {avgdl} and {stats} are fixed SQL fragments: the index's own
# statistics for the base alone, the live corpus's (passed in) over deltas
_SCORE_TEMPLATE = """
WITH p AS (
    SELECT {df} AS df, unnest(fp.postings, recursive := true)
    FROM fts_postings fp WHERE fp.termid IN ({terms})
),
top AS (
    SELECT p.docid,
           sum(""" + bm25_sql(tf="p.tf", length="p.len", df="p.df", n="{n}", avgdl="{avgdl}") + """) AS score
    FROM p{stats}
    WHERE {filters}
    GROUP BY p.docid
    ORDER BY score DESC, p.docid
    LIMIT $limit
)
SELECT f.id, top.score FROM top JOIN fts_docs f ON f.docid = top.docid
ORDER BY top.score DESC, top.docid
"""
_SCORE = (_SCORE_TEMPLATE.replace("{df}", "fp.df").replace("{n}", "st.num_docs").replace("{avgdl}", "st.avgdl")
          .replace("{stats}", ", fts_main_memories.stats st"))

# With deltas (``pipeline.store.overlay``): the same BM25, but N, avgdl and
# each term's df are the live corpus's (base minus dead memories, plus the
# deltas'), passed in, and the base's dead memories are skipped.
_BASE_TERMS = "SELECT t.term, t.termid, p.df FROM fts_terms t JOIN fts_postings p USING (termid) WHERE t.term IN ({terms})"

_TERM_CACHE = 200_000  # base terms remembered per base (a few tens of MB at most)

_DEAD_PER_TERM = """
SELECT termid, count(*) FROM (
    SELECT termid, unnest(postings).docid AS docid FROM fts_postings WHERE termid IN ({terms}))
WHERE docid IN (SELECT unnest($dead)) GROUP BY termid
"""

# each term's live df is looked up in the $dfs list by its position in $tids
# (measured faster than joining a table of them, and than the base's own query)
_SCORE_LIVE = (_SCORE_TEMPLATE.replace("{df}", "($dfs)[list_position($tids, fp.termid)]").replace("{n}", "$n")
               .replace("{avgdl}", "$avgdl").replace("{stats}", ""))

_FILTERS = {
    "ns": "p.ns = (SELECT code FROM fts_labels WHERE kind = 'namespace' AND label = $ns)",
    "types": "p.ct IN (SELECT code FROM fts_labels WHERE kind = 'content_type' AND list_contains($types, label))",
    "topics": "p.docid IN (SELECT f.docid FROM memory_topics mt JOIN fts_docs f ON f.id = mt.memory_id "
              "WHERE list_contains($topics, mt.topic_key))",
    "concepts": "p.docid IN (SELECT f.docid FROM memory_concepts mc JOIN fts_docs f ON f.id = mc.memory_id "
                "WHERE list_contains($concepts, mc.concept))",
    "dead": "p.docid NOT IN (SELECT unnest($dead))",
}


def _terms(con, text: str, settings: FulltextSettings, postings: Postings | None) -> list[str]:
    """The query's terms, by the base's cached rule when its ``postings`` are held."""
    return query_terms(con, text, settings, postings.query_terms(con, settings) if postings is not None else None)


def _scope_filters(scope: Scope, params: dict) -> str:
    scope_values = {
        "ns": scope.namespace,
        "types": list(scope.content_types),
        "topics": list(scope.topics),
        "concepts": list(scope.concepts),
    }
    filters = ["TRUE"]
    for name, value in scope_values.items():
        if value is not None and value != []:
            filters.append(_FILTERS[name])
            params[name] = value
    return " AND ".join(filters)


def search(con, text: str, scope: Scope, limit: int, settings: FulltextSettings,
           postings: Postings | None = None) -> list[tuple[str, float]]:
    """Top ``limit`` (id, BM25 score) for ``text`` within ``scope``, best first.

    Ties are broken by id so a ranking is reproducible. Each distinct query
    term counts once, as in ``match_bm25``. With the base's ``postings`` in
    memory it scores there (the same scores), except for topic and concept
    scopes, which the SQL below filters.
    """
    terms = _terms(con, text, settings, postings)
    if not terms:
        return []
    if postings is not None:
        n = postings.num_docs
        got = postings.search(postings.termids(terms), scope, limit, settings.k1, settings.b,
                              n=n, avgdl=postings.total_len / n if n else 0.0)
        if got is not None:
            return got
    slots, params = placeholders("t", terms)
    termids = [r[0] for r in con.execute(_TERM_IDS.replace("{terms}", slots), params).fetchall()]
    if not termids:
        return []
    slots, params = placeholders("t", sorted(termids))
    params.update({"k1": settings.k1, "b": settings.b, "limit": limit})
    sql = _SCORE.replace("{terms}", slots).replace("{filters}", _scope_filters(scope, params))
    return [(r[0], float(r[1])) for r in con.execute(sql, params).fetchall()]


def search_live(con, text: str, scope: Scope, limit: int, settings: FulltextSettings,
                overlay: Overlay, postings: Postings | None = None) -> list[tuple[str, float]]:
    """``search`` over the base and the deltas of ``overlay``: BM25 with the
    live corpus's N, avgdl and document frequencies, the base's dead memories
    skipped, the deltas' memories scored from their terms; one ranking, ties by id.
    """
    terms = _terms(con, text, settings, postings)
    if not terms:
        return []
    n, avgdl = overlay.live_stats()
    if postings is not None and not (scope.topics or scope.concepts):
        return _live_in_memory(terms, scope, limit, settings, overlay, postings)
    known = overlay.base_terms
    missing = [t for t in terms if t not in known]
    if missing:
        slots, params = placeholders("t", missing)
        found = {t: (termid, df) for t, termid, df in con.execute(_BASE_TERMS.replace("{terms}", slots), params).fetchall()}
        if len(known) > _TERM_CACHE:
            known.clear()
        known.update({t: found.get(t) for t in missing})
    base = {t: hit for t in terms if (hit := known.get(t)) is not None}
    dead: dict[int, int] = {}
    if base and overlay.dead_docids:
        slots, params = placeholders("t", sorted(t for t, _ in base.values()))
        params["dead"] = overlay.dead_docids
        dead = dict(con.execute(_DEAD_PER_TERM.replace("{terms}", slots), params).fetchall())
    df = {t: overlay.delta_df(t) for t in terms}
    for term, (termid, base_df) in base.items():
        df[term] += base_df - dead.get(termid, 0)
    hits = delta_hits(overlay, terms, df, scope, settings.k1, settings.b, limit)
    if base and n:
        tids = sorted(t for t, _ in base.values())
        by_id = {termid: term for term, (termid, _) in base.items()}
        slots, params = placeholders("t", tids)
        params.update({"k1": settings.k1, "b": settings.b, "limit": limit, "n": n, "avgdl": avgdl,
                       "tids": tids, "dfs": [df[by_id[t]] for t in tids]})
        filters = _scope_filters(scope, params)
        if overlay.dead_docids:
            filters += " AND " + _FILTERS["dead"]
            params["dead"] = overlay.dead_docids
        sql = _SCORE_LIVE.replace("{terms}", slots).replace("{filters}", filters)
        hits += [(r[0], float(r[1])) for r in con.execute(sql, params).fetchall()]
    hits.sort(key=lambda h: (-h[1], h[0]))
    return hits[:limit]


def _live_in_memory(terms: list[str], scope: Scope, limit: int, settings: FulltextSettings, overlay: Overlay,
                    postings: Postings) -> list[tuple[str, float]]:
    """``search_live`` from the base's postings in memory: the same statistics, no SQL."""
    n, avgdl = overlay.live_stats()
    tids = postings.termids(terms)
    dead = overlay.dead_mask(postings.num_docs)
    gone = postings.dead_per_term(list(tids.values()), dead)
    df = {t: overlay.delta_df(t) for t in terms}
    for term, tid in tids.items():
        df[term] += int(postings.df[tid]) - gone.get(tid, 0)
    hits = delta_hits(overlay, terms, df, scope, settings.k1, settings.b, limit)
    hits += postings.search(tids, scope, limit, settings.k1, settings.b, n=n, avgdl=avgdl, df=df, dead=dead) or []
    hits.sort(key=lambda h: (-h[1], h[0]))
    return hits[:limit]


def search_until(con, text: str, scope: Scope, limit: int, settings: FulltextSettings, deadline: float | None,
                 overlay: Overlay | None = None, postings: Postings | None = None):
    """``search`` (``search_live`` when ``overlay`` has deltas) that gives up at
    ``deadline`` (wall clock); returns (hits, timed_out)."""
    def run() -> list[tuple[str, float]]:
        if overlay is not None and not overlay.empty:
            return search_live(con, text, scope, limit, settings, overlay, postings)
        return search(con, text, scope, limit, settings, postings)

    if deadline is None:
        return run(), False
    remaining = deadline - time.time()
    if remaining <= 0:
        return [], True
    timer = threading.Timer(remaining, con.interrupt)
    timer.start()
    try:
        return run(), False
    except duckdb.InterruptException:
        return [], True
    finally:
        timer.cancel()


def delta_hits(overlay: Overlay, terms: list[str], df: dict[str, int], scope: Scope, k1: float, b: float,
               limit: int) -> list[tuple[str, float]]:
    """BM25 of the overlay's delta memories in scope for ``terms`` (distinct,
    stemmed), with the live document frequencies ``df`` and ``live_stats``: the
    same formula and statistics as the base's scores."""
    n, avgdl = overlay.live_stats()
    if not overlay.ids or not n:
        return []
    inside = overlay.rows_in(scope)
    scores = np.zeros(len(overlay.ids), dtype=np.float64)
    hit = np.zeros(len(overlay.ids), dtype=bool)
    for term in terms:
        if term not in overlay.postings:
            continue
        rows, tf = overlay.postings[term]
        scores[rows] += bm25(tf, overlay.lens[rows], df[term], n, avgdl, k1, b)
        hit[rows] = True
    found = np.flatnonzero(hit & inside)
    ranked = sorted(found.tolist(), key=lambda row: (-scores[row], overlay.ids[row]))[:limit]
    return [(overlay.ids[row], float(scores[row])) for row in ranked]
