-- Core tables: memories, the topic tree, membership, concepts and typed edges.
-- {dim} is the embedding dimension, an integer checked by the migration runner.

CREATE TABLE store_meta (
    key   VARCHAR PRIMARY KEY,
    value VARCHAR NOT NULL
);

CREATE TABLE memories (
    id           VARCHAR PRIMARY KEY,
    namespace    VARCHAR NOT NULL,
    content      VARCHAR NOT NULL,
    content_type VARCHAR NOT NULL,
    created_at   TIMESTAMP NOT NULL,      -- UTC
    content_hash VARCHAR NOT NULL,        -- decides whether an update re-embeds
    embedding    FLOAT[{dim}] NOT NULL,   -- unit length
    metadata     JSON,
    ingested_at  TIMESTAMP NOT NULL
);
CREATE INDEX memories_namespace ON memories (namespace);

-- The tree: a root, one node per namespace (namespaces are partitions), then
-- clusters down to leaves of at most maxLeafItems memories.
CREATE TABLE topics (
    topic_key VARCHAR PRIMARY KEY,
    parent    VARCHAR,                    -- NULL for the root
    namespace VARCHAR,                    -- NULL for the root
    depth     INTEGER NOT NULL,
    is_leaf   BOOLEAN NOT NULL,
    centroid  FLOAT[{dim}],               -- unit length; NULL for the root
    size      INTEGER NOT NULL,           -- memories below this topic
    label     VARCHAR NOT NULL
);

-- kind: 'leaf' (the one leaf holding the memory), 'ancestor' (every topic
-- above that leaf), 'user' (topic keys given at ingest).
CREATE TABLE memory_topics (
    memory_id VARCHAR NOT NULL,
    topic_key VARCHAR NOT NULL,
    kind      VARCHAR NOT NULL
);
CREATE INDEX memory_topics_topic ON memory_topics (topic_key);
CREATE INDEX memory_topics_memory ON memory_topics (memory_id);

CREATE TABLE memory_concepts (
    memory_id VARCHAR NOT NULL,
    concept   VARCHAR NOT NULL
);
CREATE INDEX memory_concepts_concept ON memory_concepts (concept);

-- kind: 'supersedes' (src replaces dst), 'conflicts' (symmetric),
-- 'supports' (src supports dst). origin is the record that declared the edge,
-- so re-ingesting that record replaces exactly its edges.
CREATE TABLE edges (
    src    VARCHAR NOT NULL,
    dst    VARCHAR NOT NULL,
    kind   VARCHAR NOT NULL,
    origin VARCHAR NOT NULL
);
CREATE INDEX edges_src ON edges (src);
CREATE INDEX edges_dst ON edges (dst);
