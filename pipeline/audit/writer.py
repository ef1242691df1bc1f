"""Writing audit rows into their own DuckDB file (``audit.duckdb``), so a query
never waits on the memory store's lock and the store's readers never wait on
audit writes.

``AuditWriter`` keeps its connection open between writes for a bounded time
(opening and closing cost more CPU than the write itself) and closes it at once when
a reader knocks (``knock_path``), so readers such as ``dimple audit tail``
get their turn within one write. Writes are idempotent by query id.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from pipeline.audit import lake
from pipeline.audit.lake import AuditLog, LakeLog
from pipeline.audit.record import AuditRecord, rows_view
from pipeline.errors import AuditStoreUnavailable
from pipeline.folders import private_dir
from pipeline.store.database import migrate_package, one, transaction


def _connect(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        if not read_only:
            private_dir(path.parent)
        return duckdb.connect(str(path), read_only=read_only)
    except (duckdb.IOException, OSError, duckdb.Error) as exc:
        raise AuditStoreUnavailable(f"cannot open audit store {path}: {exc}") from exc


def _insert(con: duckdb.DuckDBPyConnection, records: list[AuditRecord]) -> int:
    """Insert the rows whose query ids are not there yet, in one committed transaction."""
    unique: dict[str, AuditRecord] = {}
    for record in records:
        unique.setdefault(record.query_id, record)
    with rows_view(con, list(unique.values())) as (names, select, view), transaction(con):
        # an INSERT answers how many rows it inserted, those left out by the conflict not counted
        inserted = one(con, f"INSERT INTO retrieval_log ({names}) SELECT {select} FROM {view} ON CONFLICT DO NOTHING")[0]
    return int(inserted)


def write_records(path: AuditLog, records: list[AuditRecord]) -> int:
    """Insert the rows whose query ids are not there yet, in one transaction,
    over a connection of its own (opened and closed here; on the lake, one
    commit over the process's audit connection, ``pipeline.audit.lake``).

    Returns how many were inserted. Idempotent by query id, so a redelivered
    ``audit.write`` never adds a row. ``AuditWriter`` does the same over a
    connection it keeps open between writes.
    """
    if not records:
        return 0
    if isinstance(path, LakeLog):
        return lake.write(path, records)
    with _open_for_writing(path) as con:
        return _insert(con, records)


def check_writable(path: AuditLog) -> None:
    """Open the audit store for writing, as ``write_records`` does, and let go;
    ``AuditStoreUnavailable`` when it cannot be (locked, unreadable, no space)."""
    if isinstance(path, LakeLog):
        lake.check_writable(path)
        return
    with _open_for_writing(path):
        pass


@contextmanager
def _open_for_writing(path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    try:
        private_dir(path.parent)
        with knocking(path, read_only=False) as con:  # the audit worker may be holding the file
            migrate_package(con, "schema.audit")
            yield con
    except (duckdb.Error, OSError) as exc:
        raise AuditStoreUnavailable(f"cannot write audit store {path}: {exc}") from exc


def write_record(path: AuditLog, record: AuditRecord) -> bool:
    """``write_records`` for one row: True when it was inserted."""
    return write_records(path, [record]) == 1


def knock_path(path: Path) -> Path:
    """The file a reader touches to ask the writer to let go of ``path``."""
    return path.with_name(path.name + ".read-wanted")

# A waiting reader touches its knock every 20-200 ms; one older than this was
# left by a reader that died, and must not keep the writer away.
_KNOCK_FRESH_S = 2.0


def _knocked(path: Path) -> bool:
    try:
        return time.time() - knock_path(path).stat().st_mtime < _KNOCK_FRESH_S
    except OSError:
        return False


class AuditWriter:
    """Writes ``retrieval_log`` rows over a connection kept open between writes.

    A write returns only after its transaction committed (DuckDB's WAL: a
    committed row survives the process dying before the close). The hold is
    bounded: the connection is closed after ``idle_s`` without writes, after
    ``max_hold_s`` open, and within ``poll_s`` of a reader knocking
    (``knock_path``, touched by ``knocking`` while the file is locked). After
    a knock the next write waits up to ``reader_grace_s`` for the reader to
    finish (the knock file is removed once it got in) before opening again.
    Thread-safe; one per process (the audit worker is the single writer).
    """

    def __init__(self, idle_s: float = 0.5, max_hold_s: float = 5.0, poll_s: float = 0.02,
                 reader_grace_s: float = 1.0):
        self.idle_s, self.max_hold_s, self.poll_s, self.reader_grace_s = idle_s, max_hold_s, poll_s, reader_grace_s
        self._cond = threading.Condition()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._path: Path | None = None
        self._opened = self._last = 0.0
        self._closer: threading.Thread | None = None
        self._pid = os.getpid()
        self.opens = 0  # connections opened so far (tests and benchmarks read it)

    @property
    def holding(self) -> bool:
        return self._con is not None

    def write(self, path: AuditLog, records: list[AuditRecord]) -> int:
        """``write_records`` over the held connection; raises ``AuditStoreUnavailable``.
        On the lake (``LakeLog``): one commit per call, nothing held (no file lock to let go of)."""
        if not records:
            return 0
        if isinstance(path, LakeLog):
            return lake.write(path, records)
        with self._cond:
            self._forked()
            if self._con is not None and (self._path != path or self._due(time.monotonic())):
                self._close()
            if self._con is None:
                self._wait_for_reader(path)
                con = _connect(path, read_only=False)
                try:
                    migrate_package(con, "schema.audit")
                except duckdb.Error as exc:
                    con.close()
                    raise AuditStoreUnavailable(f"cannot write audit store {path}: {exc}") from exc
                self._con, self._path, self._opened = con, path, time.monotonic()
                self.opens += 1
            try:
                inserted = _insert(self._con, records)
            except duckdb.Error as exc:
                self._close()  # never reuse a connection that failed
                raise AuditStoreUnavailable(f"cannot write audit store {path}: {exc}") from exc
            self._last = time.monotonic()
            if self._due(self._last):
                self._close()
            else:
                self._start_closer()
                self._cond.notify_all()
            return inserted

    def release(self) -> None:
        """Close the connection now (flush, shutdown, before another process writes)."""
        with self._cond:
            self._forked()
            self._close()
            self._cond.notify_all()

    # -- internals (called with the condition held) --
    def _due(self, now: float) -> bool:
        return (
            now - self._last >= self.idle_s
            or now - self._opened >= self.max_hold_s
            or (self._path is not None and _knocked(self._path))
        )

    def _close(self) -> None:
        con, self._con = self._con, None
        if con is not None:
            try:
                con.close()
            except duckdb.Error:
                pass

    def _wait_for_reader(self, path: Path) -> None:
        deadline = time.monotonic() + self.reader_grace_s
        while _knocked(path) and time.monotonic() < deadline:
            self._cond.wait(self.poll_s)

    def _forked(self) -> None:
        # a forked child inherits neither the closer thread nor a usable connection
        if self._pid != os.getpid():
            self._pid, self._con, self._closer = os.getpid(), None, None

    def _start_closer(self) -> None:
        if self._closer is None or not self._closer.is_alive():
            self._closer = threading.Thread(target=self._close_when_due, name="dimple-audit-closer", daemon=True)
            self._closer.start()

    def _close_when_due(self) -> None:
        with self._cond:
            while True:
                if self._con is None:
                    self._cond.wait()
                    continue
                if self._due(time.monotonic()):
                    self._close()
                    continue
                self._cond.wait(self.poll_s)


def _busy(exc: Exception) -> bool:
    """A lock held by another process, or this process's own connection open
    with another configuration (or being opened by the writer thread at this
    moment: DuckDB's "Unique file handle conflict"): all pass once the holder lets go."""
    text = str(exc).lower()
    return isinstance(exc, duckdb.ConnectionException) or "lock" in text or "file handle conflict" in text


@contextmanager
def knocking(path: Path, read_only: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection, waiting out a writer's hold on the file (another
    process: a lock error; this process: a configuration clash).

    While it waits it knocks (``knock_path``) so an ``AuditWriter`` holding the
    file lets go and stays away until this connection has closed.
    """
    last: Exception | None = None
    knock = knock_path(path)
    knocked = False
    try:
        for attempt in range(50):
            try:
                con = duckdb.connect(str(path), read_only=read_only)
                break
            except (duckdb.IOException, duckdb.ConnectionException, duckdb.BinderException) as exc:
                if not _busy(exc):  # not a hold (a folder in its place, no such file): waiting won't help
                    raise AuditStoreUnavailable(f"cannot open audit store {path}: {exc}") from exc
                last = exc
            try:
                knock.touch()
                knocked = True
            except OSError:
                pass  # a reader without write access waits out the bounded hold instead
            time.sleep(min(0.02 * (attempt + 1), 0.2))
        else:
            raise AuditStoreUnavailable(f"audit store {path} stayed locked: {last}")
        try:
            yield con
        finally:
            con.close()
    finally:
        if knocked:
            knock.unlink(missing_ok=True)
