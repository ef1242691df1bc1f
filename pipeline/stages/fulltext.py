"""The full-text leg: BM25 over a term-ordered postings table, cost bounded by
the postings of the query's terms, not by the number of memories.

The DuckDB FTS extension builds the index (tokenizer, Porter stemmer,
stopwords; ``fts_main_memories``: ``dict``, ``terms``, ``docs``, ``stats``),
but its ``match_bm25(id, q)`` is a macro evaluated for every row of the table
it is called on: a full scan, whose cost grows with the store. So
``pipeline.store.fulltext_index`` derives, from the extension's own tables,
one posting list per term, and ``search`` reads only the lists of the query's
terms: from process memory, where a query process holds the base's postings
(``pipeline.store.postings``, read once per base), or by primary key in SQL
(topic and concept scopes, and callers without the postings).

Scores are the extension's, formula for formula (``match_bm25`` in DuckDB
1.5.5): the query is tokenized with the index's own ``tokenize`` macro, its
stopwords dropped and the rest stemmed with the index's stemmer, as the index
treats a memory's text (``match_bm25`` stems a query's stopwords instead, and
"at", the stem of "ate", then matches every memory that says "ate"); each
distinct term counts once (a repeated query term does not weigh more; unknown
terms are absent from ``dict`` and score nothing), and a memory scores the sum over matched terms of

    log10((N - df + 0.5) / (df + 0.5) + 1) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl))

with ``log`` being DuckDB's base-10 logarithm, ``len`` the memory's token
count after stopword removal, ``avgdl`` its mean, ``N`` the number of indexed
memories; the extension's defaults are k1 = 1.2, b = 0.75 and
``conjunctive := 0`` (any term matches), ours come from settings (k1 = 0.6, b = 0.5).
``tests/unit/test_fulltext.py`` checks rankings and scores against
``match_bm25`` itself (given the query's words less its stopwords) over
hundreds of random queries.

The tokenizer keeps digits and ``_`` (``ignore`` in settings), so identifiers
such as ``ERR_CONN_RESET``, ``db-17`` or ``JIRA-4412`` become tokens a query
can hit.
"""

from __future__ import annotations

import re
import threading
import time

import duckdb

from pipeline.contracts import Batch, Hit, LegRun, Scope
from pipeline.settings import FulltextSettings
from pipeline.store.database import placeholders
from pipeline.store.fulltext_index import index_exists
from pipeline.store.overlay import Overlay
from pipeline.store.postings import Postings, QueryTerms, terms_sql
from pipeline.timing import ms_since

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
           sum(log(((({n} - p.df) + 0.5) / (p.df + 0.5)) + 1)
               * ((p.tf * ($k1 + 1)) / (p.tf + ($k1 * ((1 - $b) + ($b * (p.len / {avgdl}))))))) AS score
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


_TERMS: dict[tuple[str, str, str], QueryTerms] = {}


def _stopwords(con) -> frozenset[str] | None:
    """The index's stopwords (an empty table with ``stopwords='none'``); None
    when ``con`` has no index to read them from."""
    try:
        return frozenset(r[0] for r in con.execute("SELECT sw FROM fts_main_memories.stopwords").fetchall())
    except duckdb.Error:
        return None


def _query_terms(con, text: str, settings: FulltextSettings) -> list[str]:
    """The distinct stemmed terms of ``text``, by the index's own tokenizer,
    stopwords and stemmer (``QueryTerms``)."""
    key = (settings.ignore, settings.stemmer, settings.stopwords)
    terms = _TERMS.get(key)
    if terms is None:
        stop = _stopwords(con)
        try:
            terms = QueryTerms(settings.ignore, settings.stemmer, stop or frozenset())
        except re.error:  # a pattern Python's re reads otherwise than DuckDB's RE2: the macro itself
            return terms_sql(con, text, settings.stemmer, stop or frozenset())
        if stop is not None:  # read from an index: the same for every store with these settings
            _TERMS[key] = terms
    return terms(con, text)


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
    terms = _query_terms(con, text, settings)
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
    terms = _query_terms(con, text, settings)
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
    hits = overlay.fulltext_hits(terms, df, scope, settings.k1, settings.b, limit)
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
    hits = overlay.fulltext_hits(terms, df, scope, settings.k1, settings.b, limit)
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


def fulltext_batch(batch: Batch, con, settings: FulltextSettings, overlay: Overlay | None = None,
                   postings: Postings | None = None) -> Batch:
    """The ``search.fulltext`` stage: BM25 for every query of a batch that wants it,
    over the base read through ``con`` (its ``postings`` in memory, when
    loaded) and the deltas of ``overlay``."""
    has_index = postings is not None or (con is not None and index_exists(con))
    for state in batch.states:
        q = state.query
        if not q.wants("fts"):
            state.legs["fts"] = LegRun(leg="fts", ran=False)
            continue
        t0 = time.perf_counter()
        if has_index:
            hits, timed_out = search_until(con, q.text, q.scope, q.top_k, settings, q.deadline, overlay, postings)
        else:
            hits, timed_out = [], False
        ms = ms_since(t0)
        state.legs["fts"] = LegRun(
            leg="fts",
            ran=not timed_out,
            hits=[Hit(id=m, score=s, rank=r) for r, (m, s) in enumerate(hits, start=1)],
            profile={"matched": len(hits), "timed_out": timed_out, "ms": ms},
        )
        state.timings["fulltext"] = ms
    return batch
