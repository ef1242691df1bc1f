-- `dimple reembed` on the lake (pipeline.store.reembed): the configured model's
-- vectors, committed batch by batch, until one commit puts them all in place
-- of the memories' embeddings and records the model in lake_meta (then the
-- rows are deleted). A memory replaced since its batch (another content_hash)
-- is embedded again; a run that stopped resumes from the rows here.
CREATE TABLE reembedded (
    id           VARCHAR NOT NULL,
    content_hash VARCHAR NOT NULL,        -- of the content embedded
    model        VARCHAR NOT NULL,
    embedding    BLOB NOT NULL,           -- float32, little-endian, the model's dimension
    batch        VARCHAR NOT NULL         -- the batch's write id: a batch committed twice is found
);
