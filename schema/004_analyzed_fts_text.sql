-- fts_text is now analyzed before the FTS extension indexes it
-- (pipeline.store.fulltext.analyze folds accents, but not the marks that make
-- a letter such as й or ガ; the index no longer strips accents itself). A
-- memory stored before gets its accents folded as the index folded them, so
-- its accented Latin words still match; 'dimple reindex' re-derives every
-- memory's fts_text (Han, kana and Hangul as bigrams, й and kana voicing kept).
UPDATE memories SET fts_text = strip_accents(fts_text) WHERE fts_text <> strip_accents(fts_text);
UPDATE store_meta SET value = '-1' WHERE key = 'fts_generation';  -- the index: stale until rebuilt
