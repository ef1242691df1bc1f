"""The audit trail: one ``retrieval_log`` row per query, written off the query
path, and the "why" reconstructible from that row alone.

Rows live in their own DuckDB file (``audit.duckdb``), so a query never waits
on the memory store's lock and the store's readers never wait on audit writes.
The writer (``AuditWriter``) keeps its connection open between writes for a
bounded time (opening and closing cost ~22 ms of CPU per write), and closes it
at once when a reader such as ``dimple audit tail`` knocks, so readers get
their turn within one write.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import duckdb
from pydantic import BaseModel, ConfigDict, Field

from .contracts import TOP_HITS, QueryState
from .errors import DimpleError
from .store import migrate_package

class AuditWriteError(DimpleError):
    """An audit row could not be written."""


class AuditStoreUnavailable(AuditWriteError):
    """The audit store cannot be opened or written (lock, permissions, disk)."""


class AuditRetriesExhausted(AuditWriteError):
    """Every retry failed; the row went to the dead-letter folder."""


class AuditRecord(BaseModel):
    """One ``retrieval_log`` row, as it travels to ``audit.write`` (JSON)."""

    model_config = ConfigDict(extra="forbid")

    query_id: str
    logged_at: datetime
    query_hash: str
    hash_of: str
    mode: str
    requested_mode: str
    query_text: str | None
    options: dict[str, Any]
    query_profile: dict[str, Any]
    sources: list[dict[str, Any]]
    result_count: int
    truncated: bool
    truncation: dict[str, Any] | None = None
    latency_ms: dict[str, float] = Field(default_factory=dict)
    total_ms: float
    rrf_k: int


def build_record(state: QueryState, rrf_k: int, store_text: bool, now: float | None = None) -> AuditRecord:
    """The audit row for a finished query state."""
    q = state.query
    legs = {}
    for name, leg in sorted(state.legs.items()):
        legs[name] = {
            "ran": leg.ran,
            "weight": q.weights.get(name, 0.0),
            "hits": leg.n_hits,
            "top_scores": [round(h.score, 6) for h in leg.hits[:TOP_HITS]],
            "profile": leg.profile,
        }
    options = q.options.model_dump(mode="json")
    options.update({"max_units": q.max_units, "max_chars": q.max_chars, "max_ms": q.max_ms, "top_k": q.top_k})
    if options.get("now") is None:  # recency was measured from the start: record it so replays match
        options["now"] = q.started_utc.isoformat()
    sources = [
        {
            "id": r.id,
            "rank": r.rank,
            "ranks": r.ranks,
            "rrf": r.rrf,
            "recency_factor": r.recency_factor,
            "score": r.score,
            "chars": len(r.content),
        }
        for r in state.results
    ]
    end = now if now is not None else time.time()
    return AuditRecord(
        query_id=q.id,
        logged_at=q.started_utc,
        query_hash=q.identity,
        hash_of=q.identity_of,
        mode=state.mode,
        requested_mode=q.options.mode.value,
        query_text=q.text if store_text else None,
        options=options,
        query_profile={"legs": legs, "weights": q.weights, "scope_dropped": state.scope_dropped},
        sources=sources,
        result_count=len(state.results),
        truncated=state.truncated,
        truncation=state.truncation.model_dump(mode="json") if state.truncation else None,
        latency_ms=state.timings,
        total_ms=round((end - q.started_at) * 1000.0, 3),
        rrf_k=rrf_k,
    )


def log_line(record: AuditRecord) -> str:
    """The synchronous ``hybrid.search`` line: key=value, one per query."""
    legs = record.query_profile.get("legs", {})
    counts = ",".join(f"{name}:{leg['hits']}" for name, leg in legs.items() if leg.get("ran"))
    return (
        f"hybrid.search query_id={record.query_id} hash={record.query_hash} mode={record.mode} "
        f"legs={counts or '-'} results={record.result_count} truncated={str(record.truncated).lower()} "
        f"latency_ms={record.total_ms:.1f}"
    )


# -- the audit store ------------------------------------------------------------
_COLUMNS = list(AuditRecord.model_fields)
_JSON_COLUMNS = {"options", "query_profile", "sources", "truncation", "latency_ms"}


def _connect(path: Path, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        return duckdb.connect(str(path), read_only=read_only)
    except (duckdb.IOException, OSError, duckdb.Error) as exc:
        raise AuditStoreUnavailable(f"cannot open audit store {path}: {exc}") from exc


def _insert(con: duckdb.DuckDBPyConnection, records: list[AuditRecord]) -> int:
    """Insert the rows whose query ids are not there yet, in one committed transaction."""
    placeholders = ", ".join("?" for _ in _COLUMNS)
    rows = []
    for record in records:
        row = record.model_dump(mode="json")
        rows.append([json.dumps(row[c]) if c in _JSON_COLUMNS and row[c] is not None else row[c] for c in _COLUMNS])
    con.execute("BEGIN TRANSACTION")
    try:
        before = con.execute("SELECT count(*) FROM retrieval_log").fetchone()[0]
        con.executemany(
            f"INSERT INTO retrieval_log ({', '.join(_COLUMNS)}) VALUES ({placeholders}) ON CONFLICT DO NOTHING", rows
        )
        after = con.execute("SELECT count(*) FROM retrieval_log").fetchone()[0]
        con.execute("COMMIT")
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
        raise
    return after - before


def write_records(path: Path, records: list[AuditRecord]) -> int:
    """Insert the rows whose query ids are not there yet, in one transaction,
    over a connection of its own (opened and closed here).

    Returns how many were inserted. Idempotent by query id, so a redelivered
    ``audit.write`` never adds a row. ``AuditWriter`` does the same over a
    connection it keeps open between writes.
    """
    if not records:
        return 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with _knocking(path, read_only=False) as con:  # the audit worker may be holding the file
            migrate_package(con, "schema.audit")
            return _insert(con, records)
    except (duckdb.Error, OSError) as exc:
        raise AuditStoreUnavailable(f"cannot write audit store {path}: {exc}") from exc


def write_record(path: Path, record: AuditRecord) -> bool:
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
    (``knock_path``, touched by ``_knocking`` while the file is locked). After
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

    def write(self, path: Path, records: list[AuditRecord]) -> int:
        """``write_records`` over the held connection; raises ``AuditStoreUnavailable``."""
        if not records:
            return 0
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
    with another configuration: both pass once the holder lets go."""
    return isinstance(exc, duckdb.ConnectionException) or "lock" in str(exc).lower()


@contextmanager
def _knocking(path: Path, read_only: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
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
            except (duckdb.IOException, duckdb.ConnectionException) as exc:
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


def _rows(path: Path, sql: str, params: list[Any]) -> list[AuditRecord]:
    if not path.exists():
        return []
    with _knocking(path) as con:
        cur = con.execute(sql, params)
        names = [d[0] for d in cur.description]
        out = []
        for values in cur.fetchall():
            row = dict(zip(names, values))
            for c in _JSON_COLUMNS:
                if isinstance(row.get(c), str):
                    row[c] = json.loads(row[c])
            out.append(AuditRecord.model_validate(row))
        return out


def tail(path: Path, n: int) -> list[AuditRecord]:
    rows = _rows(path, f"SELECT {', '.join(_COLUMNS)} FROM retrieval_log ORDER BY logged_at DESC, query_id LIMIT ?", [n])
    return list(reversed(rows))


def get(path: Path, query_id: str) -> AuditRecord | None:
    rows = _rows(path, f"SELECT {', '.join(_COLUMNS)} FROM retrieval_log WHERE query_id = ?", [query_id])
    return rows[0] if rows else None


def since(path: Path, start: datetime | None = None, limit: int | None = None) -> list[AuditRecord]:
    """Rows logged at or after ``start`` (naive UTC; all rows when None), oldest first."""
    sql = f"SELECT {', '.join(_COLUMNS)} FROM retrieval_log"
    params: list[Any] = []
    if start is not None:
        sql += " WHERE logged_at >= ?"
        params.append(start)
    sql += " ORDER BY logged_at, query_id"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return _rows(path, sql, params)


def count(path: Path) -> tuple[int, int]:
    """(rows, distinct query ids): equal unless something went wrong."""
    if not path.exists():
        return 0, 0
    with _knocking(path) as con:
        return con.execute("SELECT count(*), count(DISTINCT query_id) FROM retrieval_log").fetchone()


# -- dead letters -------------------------------------------------------------------
def dead_letter(folder: Path, record: AuditRecord, error: str) -> Path:
    """Keep a row whose retries ran out, with the error, for ``dimple audit retry``."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{record.query_id}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"error": error, "record": record.model_dump(mode="json")}), encoding="utf-8")
    tmp.replace(path)
    return path


def dead_letters(folder: Path) -> list[tuple[Path, str, AuditRecord]]:
    if not folder.exists():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out.append((path, data["error"], AuditRecord.model_validate(data["record"])))
    return out


def retry_dead_letters(folder: Path, audit_path: Path) -> tuple[int, int, list[str]]:
    """Write every dead letter (idempotently); returns (written, already there, errors)."""
    written = present = 0
    errors = []
    for path, _, record in dead_letters(folder):
        try:
            if write_record(audit_path, record):
                written += 1
            else:
                present += 1
            path.unlink()
        except AuditWriteError as exc:
            errors.append(f"{record.query_id}: {exc}")
    return written, present, errors


# -- explain --------------------------------------------------------------------------
def explain(record: AuditRecord) -> list[dict[str, Any]]:
    """Each result's path, from the row alone: leg ranks, RRF contribution per
    leg (``w / (k + rank)``), recency factor, final score and rank."""
    weights = record.query_profile.get("weights", {})
    out = []
    for src in record.sources:
        contributions = {
            leg: weights.get(leg, 1.0) / (record.rrf_k + rank) for leg, rank in sorted(src["ranks"].items())
        }
        out.append({
            "rank": src["rank"],
            "id": src["id"],
            "leg_ranks": src["ranks"],
            "rrf_contributions": contributions,
            "rrf": src["rrf"],
            "recency_factor": src["recency_factor"],
            "score": src["score"],
        })
    return out


# -- replay -----------------------------------------------------------------------------
def replay_options(record: AuditRecord) -> dict[str, Any]:
    """The search options that re-run a logged query as it was asked (scope,
    budgets, top-k, recency ``now``, requested mode)."""
    options = {k: v for k, v in record.options.items() if v not in (None, [], {})}
    options["mode"] = record.requested_mode
    return options


def diff_served(before: list[str], after: list[str], k: int | None = None) -> dict[str, Any]:
    """How a served list changed: one line per added, moved or dropped id, plus
    overlap@k (shared ids over the longer top-k; 1.0 when both are empty), the
    moves' mean absolute rank shift, and whether the lists are identical.

    The one definition of "what changed" used by ``dimple audit explain``,
    ``dimple eval replay`` and ``dimple eval compare``.
    """
    if k is not None:
        before, after = before[:k], after[:k]
    was = {mid: i for i, mid in enumerate(before, start=1)}
    now = {mid: i for i, mid in enumerate(after, start=1)}
    changes, shifts = [], []
    for mid, rank in now.items():
        if mid not in was:
            changes.append(f"+ {mid} now at rank {rank}")
        elif was[mid] != rank:
            changes.append(f"~ {mid} moved {was[mid]} -> {rank}")
            shifts.append(abs(was[mid] - rank))
    changes += [f"- {mid} (was rank {rank}) no longer served" for mid, rank in was.items() if mid not in now]
    longest = max(len(before), len(after))
    return {
        "same": before == after,
        "changes": changes,
        "overlap": len(was.keys() & now.keys()) / longest if longest else 1.0,
        "added": sum(1 for m in now if m not in was),
        "dropped": sum(1 for m in was if m not in now),
        "moved": len(shifts),
        "mean_abs_shift": sum(shifts) / len(shifts) if shifts else 0.0,
    }
