"""The erase's SQLite vacuum (``pipeline.store.lake.erase._vacuum_sqlite``,
run in a child process) fails as a typed ``StoreError`` naming
``store.catalog``, never a stack trace or a hang: the erase is then run again
at the next compaction."""

from __future__ import annotations

import sqlite3
import subprocess
from datetime import timedelta

import pytest

from pipeline.errors import StoreError
from pipeline.store.lake import erase
from pipeline.store.lake.catalog import Catalog


def _catalog(tmp_path) -> Catalog:
    path = tmp_path / "lake.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (x)")
    db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    db.commit()
    db.close()
    return Catalog.parse(f"sqlite:{path}")


def test_a_vacuum_of_a_quiet_catalog_empties_its_wal(tmp_path):
    catalog = _catalog(tmp_path)
    erase._vacuum_sqlite(catalog)
    wal = tmp_path / "lake.sqlite-wal"
    assert not wal.exists() or wal.stat().st_size == 0


def test_a_catalog_a_writer_holds_is_a_store_error_naming_the_catalog(tmp_path, monkeypatch):
    catalog = _catalog(tmp_path)
    monkeypatch.setattr(erase, "LOCK_WAIT", timedelta(seconds=0.5))
    holder = sqlite3.connect(catalog.target, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreError, match=r"^store\.catalog: .*could not be vacuumed .*locked"):
            erase._vacuum_sqlite(catalog)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_vacuum_past_its_bound_is_a_store_error_naming_the_catalog(tmp_path, monkeypatch):
    catalog = _catalog(tmp_path)

    def stuck(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])

    monkeypatch.setattr(erase.subprocess, "run", stuck)
    with pytest.raises(StoreError, match=r"^store\.catalog: .* was not vacuumed within 150 s"):
        erase._vacuum_sqlite(catalog)
