"""The lake's record tables (``pipeline.store.lake``), numbered like ``schema/``."""
