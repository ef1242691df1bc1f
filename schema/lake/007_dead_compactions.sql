-- Compactions found dead while they held compaction_head (compaction.claim
-- took their claim over; docs/LAKE.md, "Forget means erased"). A file such a
-- compaction wrote and never committed (an orphan: DuckLake's flush writes the
-- deleted inlined rows too) may hold a forgotten memory's bytes, and orphans
-- are deleted only once erase.LONGEST_TRANSACTION old (a younger one may be a
-- write in progress). An erase that finds an orphan from before found_at
-- leaves its forgets listed and marks the rows held: the next erase waits
-- until found_at + LONGEST_TRANSACTION + CLOCK_SLACK, when such files are
-- deleted. The rows go with the first erase that finds no such orphan.
CREATE TABLE dead_compactions (
    holder   VARCHAR NOT NULL,            -- host:pid:nonce of the compaction that died
    found_at TIMESTAMP NOT NULL,          -- UTC, the taking-over host's clock: every file it wrote is older
    held     BOOLEAN NOT NULL             -- an erase found an orphan from before found_at
);
