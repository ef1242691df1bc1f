-- The full-text leg now scores from fts_postings (derived from the FTS index
-- by pipeline.fulltext.rebuild_index); an index built before has none, so it
-- is stale until rebuilt ('dimple reindex', or the next ingest).
UPDATE store_meta SET value = '-1' WHERE key = 'fts_generation';
