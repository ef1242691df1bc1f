"""Schema, migrations and opening rules of the DuckDB store."""

from __future__ import annotations

import duckdb
import pytest

from pipeline.errors import SchemaTooNewError, StoreError
from pipeline.store.database import Store, latest_schema_version, migrations


def test_migrations_are_numbered_and_recorded(settings):
    found = migrations()
    assert [v for v, _, _ in found] == sorted({v for v, _, _ in found})
    with Store.open(settings.data_dir / "base.duckdb", read_only=False, embedding_model="hash-64", embedding_dim=64) as store:
        rows = store.con.execute("SELECT version, name FROM schema_version ORDER BY version").fetchall()
        assert [r[0] for r in rows] == [v for v, _, _ in found]
        assert store.info.schema_version == latest_schema_version()
        # the embedding column has the configured fixed dimension
        col = store.con.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_name='memories' AND column_name='embedding'"
        ).fetchone()[0]
        assert col == "FLOAT[64]"


def test_reopen_does_not_migrate_twice(settings):
    Store.open(settings.data_dir / "base.duckdb", read_only=False, embedding_model="hash-64", embedding_dim=64).close()
    with Store.open(settings.data_dir / "base.duckdb", read_only=False, embedding_dim=64) as store:
        n = store.con.execute("SELECT count(*) FROM schema_version").fetchone()[0]
    assert n == len(migrations())


def test_newer_schema_is_refused_with_a_clear_message(settings):
    Store.open(settings.data_dir / "base.duckdb", read_only=False, embedding_model="hash-64", embedding_dim=64).close()
    con = duckdb.connect(str(settings.data_dir / "base.duckdb"))
    con.execute("INSERT INTO schema_version VALUES (999, '999_future.sql', now())")
    con.close()
    for read_only in (True, False):
        with pytest.raises(SchemaTooNewError, match="newer than this dimple"):
            Store.open(settings.data_dir / "base.duckdb", read_only=read_only)


def test_other_embedding_dimension_is_refused(settings):
    Store.open(settings.data_dir / "base.duckdb", read_only=False, embedding_model="hash-64", embedding_dim=64).close()
    with pytest.raises(StoreError, match="64-d"):
        Store.open(settings.data_dir / "base.duckdb", read_only=False, embedding_model="hash-32", embedding_dim=32)


def test_missing_store_read_only_is_a_store_error(settings):
    with pytest.raises(StoreError, match="no store"):
        Store.open(settings.data_dir / "base.duckdb", read_only=True)


def test_a_version_1_store_migrates_keeping_its_data(settings):
    """A store written before schema 2 (context) opens read-write, migrates, keeps rows."""

    settings.data_dir.mkdir(parents=True)
    con = duckdb.connect(str(settings.data_dir / "base.duckdb"))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP NOT NULL)")
    (version, name, sql), *_ = migrations()
    con.execute(sql.replace("{dim}", "64"))
    con.execute("INSERT INTO schema_version VALUES (1, ?, now())", [name])
    for key, value in (("embedding_model", "hash-64"), ("embedding_dim", "64"), ("generation", "1"), ("fts_generation", "1")):
        con.execute("INSERT INTO store_meta VALUES (?, ?)", [key, value])
    con.execute("INSERT INTO memories VALUES ('m1', 'ns', 'old text', 'text', now(), 'h', [0.125]::FLOAT[] || list_transform(range(63), x -> 0.0::FLOAT), NULL, now())")
    con.close()
    with pytest.raises(StoreError, match="read-write once"):
        Store.open(settings.data_dir / "base.duckdb", read_only=True)
    with Store.open(settings.data_dir / "base.duckdb", read_only=False, embedding_dim=64) as store:
        assert store.info.schema_version == latest_schema_version() >= 2
        assert store.con.execute("SELECT content, fts_text, context FROM memories").fetchall() == [("old text", "old text", None)]
        assert store.meta("fts_generation") == "-1"  # the index must be rebuilt: stats says stale


def test_lookups_by_id_agree_for_one_query_and_for_a_batch(tmp_path):
    """Up to IN_LIST_MAX ids are an IN list (index lookups), more one shared
    semi-join; both give the same rows, unknown ids ignored."""
    from pipeline.store.database import IN_LIST_MAX, created_at_of, ids_filter

    con = duckdb.connect(str(tmp_path / "x.duckdb"))
    con.execute("CREATE TABLE memories (id VARCHAR PRIMARY KEY, created_at TIMESTAMP)")
    con.execute("INSERT INTO memories SELECT 'm' || i, TIMESTAMP '2026-01-01' + to_days(i::INTEGER) FROM range(1000) t(i)")
    few = ["m3", "m999", "nope"]
    many = [f"m{i}" for i in range(0, 1000, 2)] + ["nope"]
    assert len(few) <= IN_LIST_MAX < len(many)
    assert "IN (" in ids_filter("id", few)[0]
    # a batch's ids: one hash semi-join, not a comparison of every row with every id
    where, params = ids_filter("id", many)
    plan = con.execute(f"EXPLAIN SELECT id FROM memories WHERE {where}", params).fetchall()[0][1]
    assert "HASH_JOIN" in plan and "SEMI" in plan
    got_few, got_many = created_at_of(con, few), created_at_of(con, many)
    assert sorted(got_few) == ["m3", "m999"] and len(got_many) == 500
    assert got_few["m3"] == got_many["m2"].replace(day=got_many["m2"].day + 1)
