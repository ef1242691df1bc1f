"""``Lake``: one process's open lake, the store's next home (docs/LAKE.md).

Writes are catalog transactions (``commit``); readers follow snapshots
(``latest_snapshot``, ``changes_since``, ``read``/``count`` at a snapshot or
a time); ``erase`` forgets for good; ``expire`` keeps ``store.retain`` of history.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from pipeline.embedders import check_model
from pipeline.errors import ModelMismatchError, StoreError
from pipeline.settings import Settings
from pipeline.store.database import latest_schema_version
from pipeline.store.lake import commit as commits
from pipeline.store.lake import erase as erasing
from pipeline.store.lake import read as reads
from pipeline.store.lake.catalog import (
    SCHEMA_PACKAGE,
    Catalog,
    apply_schema,
    ask,
    attach,
    extensions_dir,
    meta_rows,
    one,
    schema_version,
)
from pipeline.store.lake.records import Changes, Committed, LakeMemory, LakeWrite

# Base loads in a row that erases may each expire under a follower (``Follower._load``).
CUT_TRIES = 5


@dataclass
class LakeInfo:
    schema_version: int
    embedding_model: str
    embedding_dim: int


def recorded(con: duckdb.DuckDBPyConnection, at: reads.At = None) -> LakeInfo:
    """What ``lake_meta`` records at ``at`` (the latest when None): the schema
    version (one row per migration applied), the embedding model and dimension.
    ``reads.Cut``: read it again (``reads.pinned``)."""
    return reads.pinned(con, at, "lake_meta", lambda snapshot, _: recorded_at(con, snapshot))


def recorded_at(con: duckdb.DuckDBPyConnection, snapshot: int) -> LakeInfo:
    """``recorded``'s statement, at ``snapshot``."""
    clause, params = reads._at(snapshot)
    return _info(reads._run(con, f"SELECT key, value FROM lake_meta{clause}", params), snapshot)


def _info(rows: list[tuple[str, str]], snapshot: int | str = "latest") -> LakeInfo:
    meta = dict(rows)
    if "embedding_model" not in meta or "embedding_dim" not in meta:  # every lake with tables records them
        raise reads.Cut(f"lake_meta read at snapshot {snapshot} came back without its rows: read it again",
                        expired=False)
    return LakeInfo(schema_version(rows), meta["embedding_model"], int(meta["embedding_dim"]))


def _current(con: duckdb.DuckDBPyConnection, embedding_model: str | None, embedding_dim: int | None) -> LakeInfo:
    """What ``lake_meta`` records, its schema first brought up to date: one
    read when it is current (a process opening a lake it wrote before)."""
    rows = meta_rows(con)
    for attempt in range(CUT_TRIES):
        if rows != []:
            break
        # the table without a row: a read beside a compaction came back short (reads.Cut), not a new lake
        time.sleep(0.01 * 2 ** attempt)
        rows = meta_rows(con)
    version = schema_version(rows)
    if rows is None or version < latest_schema_version(SCHEMA_PACKAGE):
        apply_schema(con, embedding_model, embedding_dim, version)
        rows = meta_rows(con)
    return _info(rows or [])


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
            info, _ = commits.retrying(con, lambda: _current(con, embedding_model, embedding_dim),
                                       deadline_s=settings.write_wait_s, what="creating the lake's tables")
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
        them back; it cannot reach before the erase either); unless files a
        compaction or a write that died left may hold them (``Purged.held_until``)."""
        self.commit(LakeWrite(forget=list(ids)))
        return erasing.purge(self.con, self.catalog, extensions_dir(self.settings), deadline_s=self.settings.write_wait_s)

    def expire(self) -> erasing.Purged:
        """Expire snapshots older than ``store.retain`` and delete the files only they read."""
        return erasing.expire(self.con, self.catalog, self.settings.store.retain, deadline_s=self.settings.write_wait_s)

    # -- reads -------------------------------------------------------------
    def latest_snapshot(self) -> int:
        return commits.latest_snapshot(self.con)

    def snapshot_at(self, at: reads.At) -> int:
        return reads.snapshot_at(self.con, at)

    def changes_since(self, snapshot: int, until: int | None = None) -> Changes:
        """What changed after ``snapshot``. ``StoreError`` when a ``dimple reembed``
        committed in between (``info`` then brought up to date): the changes'
        vectors are another model's than the caller's base, which it loads anew
        (``Follower.follow`` does, as for an expired snapshot)."""
        changes = reads.changes_since(self.con, snapshot, until)
        if self._reembedded(changes):
            raise StoreError(f"the lake was re-embedded with {self.info.embedding_model!r} "
                             f"({self.info.embedding_dim}-d) after snapshot {snapshot}: read a base of it")
        return changes

    def _reembedded(self, changes: Changes) -> bool:
        """Whether ``changes`` hold a re-embedding: a memory written again with
        the same content and another vector, or a vector of another size (no
        write does either: an unchanged content keeps its vector), and a
        snapshot among them is a re-embedding's commit (``REEMBED_MESSAGE``).
        One catalog read, only when the changes look so."""
        memories = changes.tables.get("memories")
        if memories is None or not memories.inserted:
            return False
        size = self.info.embedding_dim * 4
        before = {(row["id"], row["content_hash"]): row["embedding"] for _, row in memories.deleted}
        if not any(len(row["embedding"]) != size or before.get((row["id"], row["content_hash"]),
                                                               row["embedding"]) != row["embedding"]
                   for _, row in memories.inserted):
            return False
        messages = ask(self.con, "SELECT commit_message FROM ducklake_snapshot_changes WHERE snapshot_id > ? "
                                 "AND snapshot_id <= ?", [changes.since, changes.until])
        if not any((m or "").startswith(f"{commits.REEMBED_MESSAGE} ") for (m,) in messages):
            return False
        self.info = recorded(self.con)
        return True

    def read(self, at: reads.At = None, ids: list[str] | None = None) -> list[LakeMemory]:
        """The memories at ``at``, all or those among ``ids``. A whole snapshot
        (a base is built from it) is read by the model the lake records now
        (``info`` brought up to date: a ``dimple reembed`` since this process
        opened the lake), and refused (``StoreError``) when its vectors are
        another model's (a snapshot before a re-embedding). Read again when
        the catalog may have answered it short (``reads.Cut``), for up to
        ``write_wait_s``: a snapshot asked for that expired meanwhile is refused."""
        deadline = time.monotonic() + self.settings.write_wait_s
        for attempt in itertools.count():
            try:
                return self._read(at, ids)
            except reads.Cut as cut:
                if (cut.expired and at is not None) or time.monotonic() >= deadline:
                    raise
                time.sleep(min(0.01 * 2 ** attempt, 0.5))  # a compaction's steps commit in a row: let them
        raise AssertionError("unreachable")

    def _read(self, at: reads.At, ids: list[str] | None) -> list[LakeMemory]:
        return reads.pinned(self.con, at, "memories", lambda snapshot, begun: self._read_at(at, snapshot, begun, ids))

    def _read_at(self, at: reads.At, snapshot: int, begun: int, ids: list[str] | None) -> list[LakeMemory]:
        """``_read``'s statements: ``lake_meta`` (at the latest, ``begun``, and
        at ``snapshot``) when the read is whole, then the memories."""
        if ids is None:
            self.info = recorded_at(self.con, begun)
            then = self.info if snapshot == begun else recorded_at(self.con, snapshot)
            if (then.embedding_model, then.embedding_dim) != (self.info.embedding_model,
                                                               self.info.embedding_dim):
                raise StoreError(f"snapshot {at}: its embeddings are {then.embedding_dim}-d of "
                                 f"{then.embedding_model!r}, re-embedded since ('dimple reembed') with "
                                 f"{self.info.embedding_model!r}")
        return reads.read_memories(self.con, self.info.embedding_dim, snapshot, ids)

    def count(self, at: reads.At = None) -> int:
        return reads.count(self.con, at)

    def written(self, write_id: str) -> int | None:
        """The snapshot of the write ``write_id`` (a message delivered again:
        its commit's, or the latest when that has expired), else None. The
        ``writes`` table decides, not the snapshots' commit messages: after an
        erase or ``store.retain`` those are gone, and a redelivered write
        would be validated again (a link to a memory forgotten since refused)
        and re-embedded before the commit's own check."""
        row = one(self.con.execute("SELECT count(*) FROM writes WHERE write_id = ?", [write_id]))
        return commits.snapshot_of_write(self.con, write_id) if row and row[0] else None


def copy_latest(source: Settings, target: Settings) -> int:
    """The live memories of ``source``'s lake at its latest snapshot (with
    their embeddings, topics, concepts and links), written into the new lake
    ``target`` names as one write: a scratch copy (``dimple sweep``'s trees),
    nothing embedded again and ``source`` only read. Their count."""
    with Lake.open(source) as lake:
        memories = lake.read()  # one snapshot, the latest
        model, dim = lake.info.embedding_model, lake.info.embedding_dim
    with Lake.open(target, embedding_model=model, embedding_dim=dim) as copy:
        if memories:
            copy.commit(LakeWrite(remember=memories, embedding_model=model))
    return len(memories)
