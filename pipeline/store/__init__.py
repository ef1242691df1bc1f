"""The memory store and its indexes: the DuckDB database and migrations, segments (a base and deltas under a manifest),
the topic tree, the full-text index and postings, ingest and statistics.
"""
