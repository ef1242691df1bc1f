"""Numbered SQL migrations, applied in order by ``pipeline.store.database``."""
