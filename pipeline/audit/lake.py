"""The audit trail in the lake (docs/LAKE.md, "The
audit trail on many hosts"): ``retrieval_log`` is a lake table
(``schema/lake/002_retrieval_log.sql``), so every host's audit writer writes
it and ``dimple audit`` reads every host's rows from any host.

A batch of rows is one lake commit (commit message ``audit``), exactly once
by query id: the batch reads which of its ids are there and updates the one
``audit_head`` row, so two batches holding the same row at once (a message
redelivered to two workers, a host's outbox drained while its message is
written) both delete that row; the catalog commits one and the other starts
again (``commit.retrying``) and finds the ids the first wrote. Audit batches
never touch ``write_head``: they do not wait for memory writes, nor memory
writes for them (a purge does: it is listed for the erase as a forget is).

Each process keeps one attached connection per lake for its audit (attaching
loads the extensions: most of a second), apart from the store's own
(``lake.follow``): an audit commit never holds the store's lock, so a query
never waits on one.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from pipeline.audit.record import AuditRecord, insert_rows
from pipeline.errors import AuditStoreUnavailable, StoreError
from pipeline.settings import Settings
from pipeline.store.database import migrations, utcnow
from pipeline.store.lake.catalog import LAKE, SCHEMA_PACKAGE, Catalog, NoLake, apply_schema, attach, one
from pipeline.store.lake.commit import AUDIT_MESSAGE, retrying

# The commit message of an audit batch (``ducklake_snapshots``): tells its snapshots from memory writes'.
COMMIT_MESSAGE = AUDIT_MESSAGE
# The schema file that creates the audit's tables (applied alone on a lake with no memories yet).
AUDIT_SCHEMA = "002_retrieval_log.sql"


@dataclass(frozen=True)
class LakeLog:
    """Where the audit rows live: the lake ``settings`` name (``store.catalog``,
    ``store.data_path``). Equal for equal lakes."""

    catalog: str
    data_path: Path
    settings: Settings = field(compare=False, hash=False, repr=False)

    @classmethod
    def of(cls, settings: Settings) -> LakeLog:
        return cls(settings.lake_catalog, settings.lake_data_path, settings)

    def __str__(self) -> str:
        return f"retrieval_log in the lake {Catalog.parse(self.catalog)}"


def log_of(settings: Settings) -> LakeLog:
    """The audit log of ``settings``: the lake's ``retrieval_log``."""
    return LakeLog.of(settings)


class _Connections:
    """This process's attached connection per lake, for the audit (made once;
    again in a forked child, which never uses its parent's)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open: dict[LakeLog, duckdb.DuckDBPyConnection] = {}
        self.ready: set[LakeLog] = set()  # lakes whose audit tables this process has seen
        self.pid = os.getpid()

    def cursor(self, log: LakeLog, create: bool) -> duckdb.DuckDBPyConnection | None:
        """A cursor (one per use: DuckDB's rule across threads) on the lake, its
        audit tables created when ``create``; None when they do not exist and
        ``create`` is false (nothing written yet)."""
        with self.lock:
            if self.pid != os.getpid():
                self.pid, self.open, self.ready = os.getpid(), {}, set()
            con = self.open.get(log)
            fresh = con is None
            if con is None:
                try:
                    con = attach(log.settings)[0]
                except StoreError as exc:
                    raise AuditStoreUnavailable(f"cannot open {log}: {exc}") from exc
                # one core for the audit's DuckDB: its writes are a few dozen rows a
                # transaction, and a second thread only takes the core the queries
                # run on (the demo bench's keyword block, audit on over off: 2.06,
                # 2.10, 2.22 -> 1.91, 1.96, 1.93; BENCHMARKS.md, Latency floor). The
                # setting is the database's: this process's reads of the log
                # (``pipeline.audit.reader``) run on one core too.
                self.open[log] = con
            cur = None
            try:
                if fresh:
                    con.execute("SET threads = 1")
                cur = con.cursor()
                cur.execute(f"USE {LAKE}")
                if log not in self.ready:
                    if not _has_log(cur):
                        if not create:
                            cur.close()
                            return None
                        _create(cur, log.settings)
                    self.ready.add(log)
            except (duckdb.Error, AuditStoreUnavailable) as exc:
                # typed, so that audit.write retries it and then dead-letters the rows (a raw
                # duckdb.Error failed the task unretried: its message acknowledged, rows lost);
                # and the connection is never reused: the next use attaches afresh
                if cur is not None:
                    cur.close()
                self.open.pop(log, None)
                self.ready.discard(log)
                con.close()
                if isinstance(exc, AuditStoreUnavailable):
                    raise
                raise AuditStoreUnavailable(f"cannot use {log}: {type(exc).__name__}: {exc}") from exc
            return cur

    def close_all(self) -> None:
        with self.lock:
            held = list(self.open.values()) if self.pid == os.getpid() else []
            self.open, self.ready = {}, set()
        for con in held:
            con.close()

    def close(self, log: LakeLog) -> None:
        with self.lock:
            con = self.open.pop(log, None) if self.pid == os.getpid() else None
            self.ready.discard(log)
        if con is not None:
            con.close()


_CONNECTIONS = _Connections()


def _has_log(cur: duckdb.DuckDBPyConnection) -> bool:
    row = one(cur.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = 'audit_head'",
                      [LAKE]))
    return bool(row and row[0])


def _create(cur: duckdb.DuckDBPyConnection, settings: Settings) -> None:
    """The audit's tables: the lake's schema brought up to date, or, on a lake
    no memory was written to yet (its record tables need the embedding
    dimension), the audit's schema file alone; the lake's own migration finds
    them later (``IF NOT EXISTS``)."""
    sql = next(text for _, name, text in migrations(SCHEMA_PACKAGE) if name == AUDIT_SCHEMA)

    def once() -> None:
        try:
            apply_schema(cur, None, None)
            return
        except NoLake:
            pass
        cur.execute("BEGIN TRANSACTION")
        cur.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', ?)", ["schema: " + COMMIT_MESSAGE])
        cur.execute(sql)
        cur.execute("COMMIT")

    try:
        retrying(cur, once, deadline_s=settings.write_wait_s, what="creating the lake's audit tables")
    except (duckdb.Error, StoreError) as exc:
        raise AuditStoreUnavailable(f"cannot create the audit tables in the lake: {exc}") from exc


@contextmanager
def reading(log: LakeLog) -> Iterator[duckdb.DuckDBPyConnection | None]:
    """A cursor to read ``retrieval_log`` over, at the lake's latest snapshot,
    or None when the lake has no audit rows yet."""
    cur = _CONNECTIONS.cursor(log, create=False)
    try:
        yield cur
    finally:
        if cur is not None:
            cur.close()


def write(log: LakeLog, records: list[AuditRecord]) -> int:
    """The rows whose query ids the lake does not hold yet, as one commit;
    how many were inserted (0: nothing committed). Raises
    ``AuditStoreUnavailable`` (retried by the caller, then dead-lettered)."""
    unique: dict[str, AuditRecord] = {}
    for record in records:
        unique.setdefault(record.query_id, record)
    if not unique:
        return 0
    cur = _CONNECTIONS.cursor(log, create=True)
    assert cur is not None

    # A row sent again is the same row, its logged_at included: asked within the
    # batch's logged_at span (cast as the insert casts it), DuckLake reads only the
    # files whose logged_at range meets it, the newest as the log grows in time
    # order; by query id alone it read every file, so each write's check grew with
    # the log. Ordered as stored: DuckDB's cast to TIMESTAMP keeps a time's clock
    # digits and drops its offset.
    by_time = sorted(unique.values(), key=lambda r: r.logged_at.replace(tzinfo=None))
    first, last = (r.model_dump(mode="json", include={"logged_at"})["logged_at"] for r in (by_time[0], by_time[-1]))

    def once() -> int:
        cur.execute("BEGIN TRANSACTION")
        present = {r[0] for r in cur.execute(
            "SELECT query_id FROM retrieval_log WHERE logged_at BETWEEN ?::TIMESTAMP AND ?::TIMESTAMP "
            "AND query_id IN (SELECT unnest(?))", [first, last, list(unique)]).fetchall()}
        new = [r for qid, r in unique.items() if qid not in present]
        if not new:
            cur.execute("ROLLBACK")
            return 0
        cur.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', ?)", [COMMIT_MESSAGE])
        cur.execute("UPDATE audit_head SET seq = seq + 1")
        insert_rows(cur, new)
        cur.execute("COMMIT")
        return len(new)

    try:
        return retrying(cur, once, deadline_s=log.settings.write_wait_s, what="an audit batch")[0]
    except (duckdb.Error, StoreError) as exc:
        _CONNECTIONS.close(log)  # never reuse a connection that failed: the next write attaches afresh
        raise AuditStoreUnavailable(f"cannot write {log}: {exc}") from exc
    finally:
        cur.close()


def delete(log: LakeLog, query_ids: list[str]) -> int:
    """Delete the rows of ``query_ids`` as one commit; how many there were.
    Their bytes stay in the lake's files (and older snapshots read them) until
    the next erase (``pipeline.store.lake.erase``), which rewrites every
    table's files, this one's included. The purge is listed for that erase as a
    memory forget is (a ``forgets`` row at the next ``write_head`` seq), so it
    is due within ``store.erase_within``; on a lake no memory was written to
    yet (no record tables, nothing to compact) it is not listed."""
    if not query_ids:
        return 0
    cur = _CONNECTIONS.cursor(log, create=False)
    if cur is None:
        return 0
    row = one(cur.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = 'forgets'",
                      [LAKE]))
    listed = bool(row and row[0])

    def once() -> int:
        cur.execute("BEGIN TRANSACTION")
        row = one(cur.execute("SELECT count(*) FROM retrieval_log WHERE query_id IN (SELECT unnest(?))",
                          [query_ids]))
        if not row or not row[0]:
            cur.execute("ROLLBACK")
            return 0
        cur.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', ?)", [COMMIT_MESSAGE + " purge"])
        cur.execute("UPDATE audit_head SET seq = seq + 1")
        cur.execute("DELETE FROM retrieval_log WHERE query_id IN (SELECT unnest(?))", [query_ids])
        if listed:  # a seq of its own, so an erase that began before this commit leaves it listed
            cur.execute("UPDATE write_head SET seq = seq + 1")
            cur.execute("INSERT INTO forgets SELECT seq, ? FROM write_head", [utcnow()])
        cur.execute("COMMIT")
        return int(row[0])

    try:
        return retrying(cur, once, deadline_s=log.settings.write_wait_s, what="an audit purge")[0]
    except (duckdb.Error, StoreError) as exc:
        raise AuditStoreUnavailable(f"cannot purge {log}: {exc}") from exc
    finally:
        cur.close()


def check_writable(log: LakeLog) -> None:
    """Attach the lake (once a process) and create the audit tables if need be;
    ``AuditStoreUnavailable`` when that fails."""
    cur = _CONNECTIONS.cursor(log, create=True)
    if cur is not None:
        cur.close()


def release(log: LakeLog) -> None:
    """Close this process's audit connection to ``log`` (tests; a process at exit)."""
    _CONNECTIONS.close(log)


def release_all() -> None:
    """Close every audit connection of this process (its store released: another
    data dir, shutdown); the next write or read attaches again."""
    _CONNECTIONS.close_all()
