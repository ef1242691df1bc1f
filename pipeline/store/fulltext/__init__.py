"""The full-text leg's data side, and its face: what other packages may use.

``terms`` (how text becomes terms: ``analyze``, the index's PRAGMA, ``QueryTerms``,
the writer's ``tokenize``), ``porter`` (the default stemmer, as DuckDB's),
``bm25`` (the one formula: numpy, SQL, IDF),
``index`` (building the FTS index and its postings table; base totals),
``postings`` (a base's postings in memory, scored with numpy) and
``ranking`` (BM25 over base and deltas as one corpus: ``search``).
"""

from pipeline.store.fulltext.bm25 import bm25, idf
from pipeline.store.fulltext.index import derive_postings, fulltext_totals, index_exists, live_base, rebuild_index
from pipeline.store.fulltext.postings import Postings
from pipeline.store.fulltext.ranking import delta_hits, search, search_live, search_until
from pipeline.store.fulltext.terms import QueryTerms, analyze, query_terms, terms_sql, tokenize

__all__ = [
    "Postings", "QueryTerms", "analyze", "bm25", "delta_hits", "derive_postings", "fulltext_totals", "idf", "index_exists",
    "live_base", "query_terms", "rebuild_index", "search", "search_live", "search_until", "terms_sql",
    "tokenize",
]
