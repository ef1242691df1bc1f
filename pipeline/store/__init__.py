"""The memory store: the DuckDB database and migrations (``database``),
segments (a base and deltas under a manifest), what one process reads of them
(``reader``, ``overlay``), writes and compaction, ingest, statistics, the
graph a query reads (``graph``) and the two indexes, each a package with a
face: ``vector`` (the topic tree, the vector index, its descent and kernels,
the router for new memories) and ``fulltext`` (terms, BM25, the FTS index
and its postings, search over base and deltas).
"""
