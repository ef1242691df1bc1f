"""Building the full-text index: DuckDB's FTS extension indexes the memories
(tokenizer, Porter stemmer, stopwords; ``fts_main_memories``), and
``derive_postings`` turns its tables into one posting list per term
(``fts_postings``: memory, term frequency, memory length and the scope codes
the filters need), which the full-text search (``pipeline.store.fulltext.ranking``)
reads by primary key or holds in memory (``pipeline.store.fulltext.postings``).

The FTS index does not follow inserts, so ingest rebuilds it (and the
postings) inside its transaction: a memory is searchable as soon as its
ingest returns.
"""

from __future__ import annotations

from pipeline.settings import FulltextSettings
from pipeline.store.database import one, rows_by_ids
from pipeline.store.fulltext.terms import create_index_sql

# docid: the rank of the memory id, so ordering by docid is ordering by id
# (the tie-break of a ranking) without reading ids. fts_postings: one row per
# term, its postings a list of (docid, tf, the memory's length, the dense
# codes of its namespace and content type: ns/ct), so
# those scope filters apply to the postings read, before any other table.
_DERIVE = [
    """CREATE OR REPLACE TABLE fts_labels AS
       SELECT 'namespace' AS kind, namespace AS label, (dense_rank() OVER (ORDER BY namespace) - 1)::INTEGER AS code
       FROM (SELECT DISTINCT namespace FROM memories)
       UNION ALL
       SELECT 'content_type', content_type, (dense_rank() OVER (ORDER BY content_type) - 1)::INTEGER
       FROM (SELECT DISTINCT content_type FROM memories)""",
    """CREATE OR REPLACE TABLE fts_docs (
           docid INTEGER PRIMARY KEY, fts_docid BIGINT NOT NULL, id VARCHAR NOT NULL,
           len INTEGER NOT NULL, ns INTEGER NOT NULL, ct INTEGER NOT NULL)""",
    """INSERT INTO fts_docs
       SELECT (row_number() OVER (ORDER BY m.id) - 1)::INTEGER, d.docid, m.id, d.len::INTEGER, n.code, c.code
       FROM fts_main_memories.docs d
       JOIN memories m ON m.id = d.name
       JOIN fts_labels n ON n.kind = 'namespace' AND n.label = m.namespace
       JOIN fts_labels c ON c.kind = 'content_type' AND c.label = m.content_type
       ORDER BY m.id""",
    """CREATE OR REPLACE TABLE fts_terms (term VARCHAR PRIMARY KEY, termid INTEGER NOT NULL)""",
    """INSERT INTO fts_terms SELECT term, termid FROM fts_main_memories.dict""",
    """CREATE OR REPLACE TABLE fts_postings (
           termid INTEGER PRIMARY KEY, df INTEGER NOT NULL,
           postings STRUCT(docid INTEGER, tf INTEGER, len INTEGER, ns INTEGER, ct INTEGER)[] NOT NULL)""",
    # one list of structs (not parallel lists, whose alignment an unordered
    # aggregate would not promise) in no particular order: scoring groups by
    # docid; an ORDER BY inside the aggregate needs several GB at 1M memories
    """INSERT INTO fts_postings
       SELECT termid, count(*)::INTEGER, list({'docid': docid, 'tf': tf, 'len': len, 'ns': ns, 'ct': ct})
       FROM (
           SELECT t.termid::INTEGER AS termid, f.docid, count(*)::INTEGER AS tf,
                  any_value(f.len) AS len, any_value(f.ns) AS ns, any_value(f.ct) AS ct
           FROM fts_main_memories.terms t JOIN fts_docs f ON f.fts_docid = t.docid
           GROUP BY t.termid, f.docid)
       GROUP BY termid""",
]

_DERIVED_TABLES = ("fts_labels", "fts_docs", "fts_terms", "fts_postings")


def rebuild_index(con, settings: FulltextSettings) -> None:
    """(Re)create the BM25 index over ``memories.fts_text`` (content, then context)
    and the postings derived from it."""
    con.execute(create_index_sql("memories", "id", settings))
    derive_postings(con)


def derive_postings(con) -> None:
    """(Re)derive ``fts_labels``, ``fts_docs``, ``fts_terms`` and ``fts_postings``
    from the extension's current index tables (runs in the caller's transaction)."""
    for sql in _DERIVE:
        con.execute(sql)


def index_exists(con) -> bool:
    """The FTS index and the postings derived from it are both present."""
    schemas = one(con, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'fts_main_memories'")[0]
    tables = one(
        con,
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'main' AND list_contains(?, table_name)",
        [list(_DERIVED_TABLES)],
    )[0]
    return bool(schemas) and tables == len(_DERIVED_TABLES)


def fulltext_totals(con) -> tuple[int, int]:
    """(documents, summed token count) of a base's full-text index; (0, 0) without one."""
    if not index_exists(con):
        return 0, 0
    docs, total = one(con, "SELECT count(*), coalesce(sum(len), 0) FROM fts_docs")
    return int(docs), int(total)


def live_base(con, dead_ids: list[str], totals: tuple[int, int] | None) -> tuple[int, int, list[int]]:
    """(live documents, their summed length, dead docids) of the base's full-text
    index, ``dead_ids`` left out; ``totals`` is ``fulltext_totals`` when the caller keeps it."""
    docs, total = totals if totals is not None else fulltext_totals(con)
    if not docs:
        return 0, 0, []
    dead: list[int] = []
    if dead_ids:
        rows = rows_by_ids(con, "SELECT docid, len FROM fts_docs WHERE {id}", dead_ids, lookups=True)
        dead = [r[0] for r in rows]
        docs -= len(rows)
        total -= sum(r[1] for r in rows)
    return int(docs), int(total), dead
