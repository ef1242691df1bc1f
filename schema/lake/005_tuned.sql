-- The store's tuned fusion settings on the lake (pipeline.store.tuned, `dimple
-- tune --apply`): one row, every host sharing the catalog serves the same
-- ones. document: the tuned settings as JSON (NULL: none, the environment's
-- apply). An apply or reset updates the one row, so two at once conflict and
-- the catalog commits one.
CREATE TABLE tuned (
    document VARCHAR
);
INSERT INTO tuned VALUES (NULL);
