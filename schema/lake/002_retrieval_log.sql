-- The audit trail in the lake (docs/LAKE.md, "The audit trail on many hosts"):
-- the columns of schema/audit's retrieval_log, one row per query. DuckLake
-- has no keys: the audit writer (pipeline.audit.lake) keeps query ids unique,
-- one batch a commit. IF NOT EXISTS: an audit writer may create these two
-- tables before any memory was written (the lake's other tables need the
-- embedding dimension); this migration then finds them.

CREATE TABLE IF NOT EXISTS retrieval_log (
    query_id       VARCHAR NOT NULL,      -- exactly once: checked by each batch, serialised by audit_head
    logged_at      TIMESTAMP NOT NULL,    -- UTC, when the query started
    query_hash     VARCHAR NOT NULL,
    hash_of        VARCHAR NOT NULL,
    mode           VARCHAR NOT NULL,
    requested_mode VARCHAR NOT NULL,
    query_text     VARCHAR,               -- NULL when DIMPLE_STORE_QUERY_TEXT=false
    options        JSON NOT NULL,
    query_profile  JSON NOT NULL,
    sources        JSON NOT NULL,
    result_count   INTEGER NOT NULL,
    truncated      BOOLEAN NOT NULL,
    truncation     JSON,
    latency_ms     JSON NOT NULL,
    total_ms       DOUBLE NOT NULL,
    rrf_k          INTEGER NOT NULL
);

-- One row that every audit batch updates (never write_head: audit rows and
-- memory writes do not wait on each other): two batches at once both delete
-- it, so the catalog commits one and the other starts again and finds the
-- query ids the first wrote.
CREATE TABLE IF NOT EXISTS audit_head (
    seq BIGINT NOT NULL
);
INSERT INTO audit_head SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM audit_head);
