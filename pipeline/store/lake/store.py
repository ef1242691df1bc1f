"""``Lake``: one process's open lake, the store's next home (docs/LAKE.md).

Writes are catalog transactions (``commit``); readers follow snapshots
(``latest_snapshot``, ``changes_since``, ``read``/``count`` at a snapshot or
a time); ``erase`` forgets for good; ``expire`` keeps ``store.retain`` of history.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb

from pipeline.embedders import check_model
from pipeline.errors import ModelMismatchError, StoreError
from pipeline.settings import Settings
from pipeline.store.lake import commit as commits
from pipeline.store.lake import erase as erasing
from pipeline.store.lake import read as reads
from pipeline.store.lake.catalog import Catalog, apply_schema, attach, extensions_dir
from pipeline.store.lake.records import Changes, Committed, LakeMemory, LakeWrite


@dataclass
class LakeInfo:
    schema_version: int
    embedding_model: str
    embedding_dim: int


class Lake:
    """An attached lake. Use ``cursor()`` per thread (DuckDB's rule)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, catalog: Catalog, data_path: Path, info: LakeInfo,
                 settings: Settings):
        self.con = con
        self.catalog = catalog
        self.data_path = data_path
        self.info = info
        self.settings = settings

    @classmethod
    def open(cls, settings: Settings, *, embedding_model: str | None = None, embedding_dim: int | None = None,
             attached: tuple[duckdb.DuckDBPyConnection, Catalog, Path] | None = None) -> Lake:
        """Attach the lake ``settings`` name (``store.catalog``, ``store.data_path``),
        creating its record tables when new. A new lake records ``embedding_model``
        and ``embedding_dim``; an existing one must match them when given (``check_model``).
        ``attached``: a connection ``catalog.attach`` made, kept open on failure
        (a reader holds one while the lake has no tables: ``NoLake``)."""
        con, catalog, data_path = attached or attach(settings)
        try:
            commits.retrying(con, lambda: apply_schema(con, embedding_model, embedding_dim),
                             deadline_s=settings.write_wait_s, what="creating the lake's tables")
            meta = dict(con.execute("SELECT key, value FROM lake_meta").fetchall())
            info = LakeInfo(int(meta["schema_version"]), meta["embedding_model"], int(meta["embedding_dim"]))
        except BaseException:
            if attached is None:
                con.close()
            raise
        try:
            check_model(info.embedding_model, info.embedding_dim, embedding_model, embedding_dim, f"the lake at {catalog}")
        except ModelMismatchError:
            if attached is None:
                con.close()
            raise
        return cls(con, catalog, data_path, info, settings)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self.con.cursor()

    # -- writes ------------------------------------------------------------
    def commit(self, write: LakeWrite) -> Committed:
        """``write`` as one transaction (retried on conflict up to ``write_wait_s``); its snapshot."""
        for m in write.remember:
            if m.embedding.shape != (self.info.embedding_dim,):
                raise StoreError(f"memory {m.id!r}: a {m.embedding.shape} embedding in a "
                                 f"{self.info.embedding_dim}-d lake")
        return commits.commit(self.con, write, deadline_s=self.settings.write_wait_s)

    def erase(self, ids: list[str]) -> erasing.Purged:
        """Forget ``ids`` (one write) and purge: their bytes leave every file and
        the catalog, and every older snapshot expires (time travel cannot bring
        them back; it cannot reach before the erase either)."""
        self.commit(LakeWrite(forget=list(ids)))
        return erasing.purge(self.con, self.catalog, extensions_dir(self.settings), deadline_s=self.settings.write_wait_s)

    def expire(self) -> erasing.Purged:
        """Expire snapshots older than ``store.retain`` and delete the files only they read."""
        return erasing.expire(self.con, self.settings.store.retain, deadline_s=self.settings.write_wait_s)

    # -- reads -------------------------------------------------------------
    def latest_snapshot(self) -> int:
        return commits.latest_snapshot(self.con)

    def snapshot_at(self, at: reads.At) -> int:
        return reads.snapshot_at(self.con, at)

    def changes_since(self, snapshot: int, until: int | None = None) -> Changes:
        return reads.changes_since(self.con, snapshot, until)

    def read(self, at: reads.At = None, ids: list[str] | None = None) -> list[LakeMemory]:
        return reads.read_memories(self.con, self.info.embedding_dim, at, ids)

    def count(self, at: reads.At = None) -> int:
        return reads.count(self.con, at)

    def written(self, write_id: str) -> bool:
        """Whether a write with this id has been committed."""
        row = self.con.execute("SELECT count(*) FROM writes WHERE write_id = ?", [write_id]).fetchone()
        return bool(row and row[0])
