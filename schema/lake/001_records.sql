-- The lake's record tables: what users wrote, nothing derived. The topic tree,
-- its membership and the full-text postings are built from these per snapshot
-- by compaction (docs/LAKE.md). DuckLake tables have no keys or indexes: the
-- writer (pipeline.store.lake.commit) keeps ids unique, one write at a time.

CREATE TABLE lake_meta (
    key   VARCHAR NOT NULL,
    value VARCHAR NOT NULL
);

CREATE TABLE memories (
    id           VARCHAR NOT NULL,
    namespace    VARCHAR NOT NULL,
    content      VARCHAR NOT NULL,
    content_type VARCHAR NOT NULL,
    created_at   TIMESTAMP NOT NULL,      -- UTC
    content_hash VARCHAR NOT NULL,        -- decides whether an update re-embeds
    embedding    BLOB NOT NULL,           -- float32, little-endian, unit length (DuckLake has no FLOAT[n])
    metadata     JSON,
    context      VARCHAR,                 -- full-text indexed with the content, never embedded
    ingested_at  TIMESTAMP NOT NULL
);

-- Topic keys given at ingest (the tree's own 'leaf'/'ancestor' rows are derived).
CREATE TABLE memory_topics (
    memory_id VARCHAR NOT NULL,
    topic_key VARCHAR NOT NULL
);

CREATE TABLE memory_concepts (
    memory_id VARCHAR NOT NULL,
    concept   VARCHAR NOT NULL
);

-- kind: 'supersedes' (src replaces dst), 'conflicts' (symmetric), 'supports'
-- (src supports dst); origin is the record that declared the edge.
CREATE TABLE edges (
    src    VARCHAR NOT NULL,
    dst    VARCHAR NOT NULL,
    kind   VARCHAR NOT NULL,
    origin VARCHAR NOT NULL
);

-- One row per committed write (a broker message's task id): a write delivered
-- again finds its id here and is not applied twice.
CREATE TABLE writes (
    write_id     VARCHAR NOT NULL,
    committed_at TIMESTAMP NOT NULL,
    remembered   INTEGER NOT NULL,
    forgotten    INTEGER NOT NULL
);

-- One row that every write updates: two writes at once both delete it, so the
-- catalog lets one commit and the other retry (writes are serialised, none lost).
CREATE TABLE write_head (
    seq BIGINT NOT NULL
);
INSERT INTO write_head VALUES (0);
