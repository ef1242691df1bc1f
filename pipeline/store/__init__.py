"""The memory store and its indexes: the DuckDB database and migrations, published generations,
the topic tree, the full-text index and postings, ingest and statistics.
"""
