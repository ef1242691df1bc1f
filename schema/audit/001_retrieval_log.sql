-- The audit store (its own DuckDB file, written only by the audit writer):
-- one fused row per query, enough to answer "why did the agent say this?".

CREATE TABLE retrieval_log (
    query_id       VARCHAR PRIMARY KEY,   -- idempotency key: a redelivered write adds nothing
    logged_at      TIMESTAMP NOT NULL,    -- UTC, when the query started
    query_hash     VARCHAR NOT NULL,      -- FNV-1a 64 (hex) of the text, or of the vector in semantic mode
    hash_of        VARCHAR NOT NULL,      -- 'text' or 'vector'
    mode           VARCHAR NOT NULL,      -- the legs that actually ran
    requested_mode VARCHAR NOT NULL,
    query_text     VARCHAR,               -- NULL when DIMPLE_STORE_QUERY_TEXT=false
    options        JSON NOT NULL,         -- scope, budgets, recency, now: enough to replay
    query_profile  JSON NOT NULL,         -- per leg: ran, counts, top scores, weight, timing, profile
    sources        JSON NOT NULL,         -- per result: id, final rank, leg ranks, rrf, recency, score
    result_count   INTEGER NOT NULL,
    truncated      BOOLEAN NOT NULL,
    truncation     JSON,
    latency_ms     JSON NOT NULL,         -- per stage
    total_ms       DOUBLE NOT NULL,
    rrf_k          INTEGER NOT NULL
);
CREATE INDEX retrieval_log_time ON retrieval_log (logged_at);
