-- Optional context of a memory (e.g. the message it replies to): indexed for
-- full-text search together with the content, neither embedded nor returned.
-- fts_text is what the BM25 index covers: content, then context.
ALTER TABLE memories ADD COLUMN context VARCHAR;
ALTER TABLE memories ADD COLUMN fts_text VARCHAR;
UPDATE memories SET fts_text = content;
UPDATE store_meta SET value = '-1' WHERE key = 'fts_generation';  -- the index now covers fts_text: stale until rebuilt
