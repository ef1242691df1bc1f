"""Reading the retrieval log: the last rows, one row (by its id or a unique
prefix of it), rows since a time, counts. ``retrieval_log`` is read in the
lake (``pipeline.audit.lake``) at its latest snapshot: every host's rows,
from any host.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import duckdb

from pipeline.audit import lake
from pipeline.audit.lake import LakeLog
from pipeline.audit.record import COLUMNS, JSON_COLUMNS, AuditRecord
from pipeline.errors import InputError
from pipeline.store.database import one

# The shortest query id prefix ``find`` takes (git's default abbreviation is 7; ids are 32 hex digits).
MIN_PREFIX = 4
# Candidates an ambiguous prefix names.
SHOWN_CANDIDATES = 10


@contextmanager
def _log(log: LakeLog) -> Iterator[duckdb.DuckDBPyConnection | None]:
    """A cursor to read ``retrieval_log`` over, or None when the lake has no
    audit tables yet (nothing written)."""
    with lake.reading(log) as cur:
        yield cur


def _rows(log: LakeLog, sql: str, params: list[Any]) -> list[AuditRecord]:
    with _log(log) as con:
        return [] if con is None else rows_of(con, sql, params)


def rows_of(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> list[AuditRecord]:
    """The rows ``sql`` selects (``COLUMNS``) as records, their JSON columns parsed."""
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    out = []
    for values in cur.fetchall():
        row = dict(zip(names, values))
        for c in JSON_COLUMNS:
            if isinstance(row.get(c), str):
                row[c] = json.loads(row[c])
        out.append(AuditRecord.model_validate(row))
    return out


def tail(log: LakeLog, n: int) -> list[AuditRecord]:
    rows = _rows(log, f"SELECT {', '.join(COLUMNS)} FROM retrieval_log ORDER BY logged_at DESC, query_id LIMIT ?", [n])
    return list(reversed(rows))


def get(log: LakeLog, query_id: str) -> AuditRecord | None:
    rows = _rows(log, f"SELECT {', '.join(COLUMNS)} FROM retrieval_log WHERE query_id = ?", [query_id])
    return rows[0] if rows else None

def find(log: LakeLog, id_or_prefix: str) -> AuditRecord | None:
    """The row whose query id is ``id_or_prefix``, or the one row whose id starts
    with it (as git takes a commit's abbreviation); None when none does.

    Raises ``InputError`` (field ``query_id``) for a prefix shorter than
    ``MIN_PREFIX`` that is not a whole id, or one that several ids share
    (naming up to ``SHOWN_CANDIDATES`` of them).
    """
    exact = get(log, id_or_prefix)
    if exact is not None:
        return exact
    if len(id_or_prefix) < MIN_PREFIX:
        raise InputError("query_id", f"{id_or_prefix!r} is too short: give at least {MIN_PREFIX} characters of the id")
    with _log(log) as con:
        if con is None:
            return None
        ids = [r[0] for r in con.execute(
            "SELECT query_id FROM retrieval_log WHERE starts_with(query_id, ?) ORDER BY query_id LIMIT ?",
            [id_or_prefix, SHOWN_CANDIDATES + 1],
        ).fetchall()]
    if len(ids) > 1:
        more = ", ..." if len(ids) > SHOWN_CANDIDATES else ""
        raise InputError("query_id", f"{id_or_prefix!r} is ambiguous, give more characters; it starts "
                                     f"{', '.join(ids[:SHOWN_CANDIDATES])}{more}")
    return get(log, ids[0]) if ids else None

def since(log: LakeLog, start: datetime | None = None, limit: int | None = None) -> list[AuditRecord]:
    """Rows logged at or after ``start`` (naive UTC; all rows when None), oldest first."""
    sql = f"SELECT {', '.join(COLUMNS)} FROM retrieval_log"
    params: list[Any] = []
    if start is not None:
        sql += " WHERE logged_at >= ?"
        params.append(start)
    sql += " ORDER BY logged_at, query_id"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return _rows(log, sql, params)


def count(log: LakeLog) -> tuple[int, int]:
    """(rows, distinct query ids): equal unless something went wrong."""
    with _log(log) as con:
        if con is None:
            return 0, 0
        rows, query_ids = one(con, "SELECT count(*), count(DISTINCT query_id) FROM retrieval_log")
        return rows, query_ids
