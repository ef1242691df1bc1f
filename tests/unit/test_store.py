"""Schema, migrations and opening rules of the DuckDB store."""

from __future__ import annotations

import duckdb
import pytest

from pipeline.errors import SchemaTooNewError, StoreError
from pipeline.store import Store, latest_schema_version, migrations


def test_migrations_are_numbered_and_recorded(settings):
    found = migrations()
    assert [v for v, _, _ in found] == sorted({v for v, _, _ in found})
    with Store.open(settings.store_path, read_only=False, embedding_model="hash-64", embedding_dim=64) as store:
        rows = store.con.execute("SELECT version, name FROM schema_version ORDER BY version").fetchall()
        assert [r[0] for r in rows] == [v for v, _, _ in found]
        assert store.info.schema_version == latest_schema_version()
        # the embedding column has the configured fixed dimension
        col = store.con.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_name='memories' AND column_name='embedding'"
        ).fetchone()[0]
        assert col == "FLOAT[64]"


def test_reopen_does_not_migrate_twice(settings):
    Store.open(settings.store_path, read_only=False, embedding_model="hash-64", embedding_dim=64).close()
    with Store.open(settings.store_path, read_only=False, embedding_dim=64) as store:
        n = store.con.execute("SELECT count(*) FROM schema_version").fetchone()[0]
    assert n == len(migrations())


def test_newer_schema_is_refused_with_a_clear_message(settings):
    Store.open(settings.store_path, read_only=False, embedding_model="hash-64", embedding_dim=64).close()
    con = duckdb.connect(str(settings.store_path))
    con.execute("INSERT INTO schema_version VALUES (999, '999_future.sql', now())")
    con.close()
    for read_only in (True, False):
        with pytest.raises(SchemaTooNewError, match="newer than this dimple"):
            Store.open(settings.store_path, read_only=read_only)


def test_other_embedding_dimension_is_refused(settings):
    Store.open(settings.store_path, read_only=False, embedding_model="hash-64", embedding_dim=64).close()
    with pytest.raises(StoreError, match="64-d"):
        Store.open(settings.store_path, read_only=False, embedding_model="hash-32", embedding_dim=32)


def test_missing_store_read_only_is_a_store_error(settings):
    with pytest.raises(StoreError, match="no store"):
        Store.open(settings.store_path, read_only=True)
