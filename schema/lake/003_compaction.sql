-- Compaction of the lake (docs/LAKE.md, "Derived indexes" and "Forget means erased").

-- The bases built from the lake, one row each: every process (and every host
-- sharing the catalog and store.index_path) finds the newest through here.
-- path: the base file's name under store.index_path.
CREATE TABLE indexes (
    snapshot  BIGINT NOT NULL,
    path      VARCHAR NOT NULL,
    built_at  TIMESTAMP NOT NULL,         -- UTC
    settings  VARCHAR NOT NULL            -- digest of the settings that shaped the base (tree, full text, model)
);

-- One row that a compaction claims (holder, claimed_at) in a transaction of
-- its own and gives back when done: two compactions at once both update it, so
-- the catalog lets one commit and the other finds it held (one at a time,
-- across processes and hosts). A claim older than the lease (a compaction
-- killed midway) may be taken over.
CREATE TABLE compaction_head (
    seq        BIGINT NOT NULL,
    holder     VARCHAR,
    claimed_at TIMESTAMP
);
INSERT INTO compaction_head VALUES (0, NULL, NULL);

-- Forgets whose bytes are not yet erased: a forget write adds its write_head
-- seq and time (no id: the row outlives the memory's bytes until the erase);
-- an erase (erase.purge) deletes the rows of the writes it covered.
CREATE TABLE forgets (
    seq          BIGINT NOT NULL,
    forgotten_at TIMESTAMP NOT NULL       -- UTC, the writer's clock
);
