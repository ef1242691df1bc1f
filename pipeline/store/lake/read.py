"""Reading the lake: at the latest snapshot or an older one (time travel), and
what changed between two snapshots (``ducklake_table_changes``), which is how
a reader brings its indexes from the snapshot they reflect to the latest."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import duckdb

from pipeline.errors import InputError, StoreError
from pipeline.store.lake.catalog import LAKE, ask, one
from pipeline.store.lake.commit import latest_snapshot
from pipeline.store.lake.records import Changes, LakeMemory, TableChanges, vectors_of

T = TypeVar("T")

# Snapshot or time: a snapshot id, or a time (naive = UTC) read as the last snapshot committed by then.
At = int | datetime | None

# The record tables and their columns, in the order of schema/lake (``changes_since`` reports these).
TABLES = {
    "memories": ("id", "namespace", "content", "content_type", "created_at", "content_hash", "embedding", "metadata",
                 "context", "ingested_at"),
    "memory_topics": ("memory_id", "topic_key"),
    "memory_concepts": ("memory_id", "concept"),
    "edges": ("src", "dst", "kind", "origin"),
}


def _at(at: At) -> tuple[str, dict[str, Any]]:
    """The ``AT (...)`` clause for ``at`` and its bound parameter (none for the latest)."""
    if at is None:
        return "", {}
    if isinstance(at, datetime):
        stamp = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
        return " AT (TIMESTAMP => $at)", {"at": stamp}
    if isinstance(at, int) and not isinstance(at, bool) and at >= 0:
        return " AT (VERSION => $at)", {"at": at}
    raise InputError("as_of", "a snapshot id (an integer >= 0) or a time")


class SnapshotGone(InputError):
    """A read at a snapshot the lake does not hold (expired, or not yet
    committed): the caller's ``as_of`` when it named it; when the reader
    pinned the latest itself, an erase expired it meanwhile (``Cut``)."""

    def __init__(self, at: object):
        super().__init__("as_of", f"no snapshot of the lake at {at!r} (expired, or not yet committed)")


def _run(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any]) -> list[tuple]:
    try:
        return con.execute(sql, params).fetchall()
    except duckdb.InvalidInputException as exc:
        if "No snapshot found" in str(exc):
            raise SnapshotGone(params.get("at")) from None
        raise


def expired_meanwhile(snapshot: int, what: str) -> Cut:
    """The ``Cut`` of a read whose latest snapshot, pinned by the reader, an
    erase expired before the read's statements reached it."""
    return Cut(f"snapshot {snapshot} of the lake expired while {what} was read from it (an erase, or "
               "store.retain): read it again at the latest snapshot", expired=True)


class Cut(StoreError):
    """A read the catalog may have answered short, without an error: its
    snapshot expired while it was read (``expired``: an erase's cut, or
    ``store.retain``), or a compaction moved the lake's files meanwhile (a
    flush and merge on a SQLite catalog: 7 of 2,410 reads of a table beside
    60 of them came back empty here). Read again: at the same snapshot after
    a compaction, at the latest after an expiry."""

    def __init__(self, message: str, *, expired: bool):
        super().__init__(message)
        self.expired = expired
        self.listing: int | None = None  # a base taken back (``derive.record``): the snapshot that had listed it


# The changes a snapshot that only inserts or deletes rows lists
# (``ducklake_snapshot_changes.changes_made``); any other (an inline flush, a
# merge or rewrite of files, a table created) may have moved a table's files.
_ROW_CHANGES = frozenset({"inlined_insert", "inlined_delete", "inserted_into_table", "deleted_from_table"})


def oldest(con: duckdb.DuckDBPyConnection) -> int:
    """The oldest snapshot the lake holds (expiry only ever drops the oldest),
    asked of the catalog (``catalog.ask``)."""
    row = ask(con, "SELECT min(snapshot_id) FROM ducklake_snapshot")
    return int(row[0][0]) if row and row[0][0] is not None else 0


def settled(con: duckdb.DuckDBPyConnection, snapshot: int, since: int, what: str) -> None:
    """After a read at ``snapshot`` (``what``) begun when ``since`` was the
    latest: ``Cut`` when the snapshot expired meanwhile, or a snapshot after
    ``since`` moved files (``_ROW_CHANGES``). Neither: the catalog answered
    the read whole. Two questions to the catalog by key (``catalog.ask``,
    ~1 ms each): whether the snapshot is still there, then the changes of the
    snapshots committed since the read began (none or a few). Asked in that
    order, each of its own: a snapshot there now was there for the read, and
    the second question sees every commit the first did."""
    there = ask(con, "SELECT snapshot_id FROM ducklake_snapshot WHERE snapshot_id = ?", [snapshot])
    later = ask(con, "SELECT snapshot_id, changes_made FROM ducklake_snapshot_changes WHERE snapshot_id > ?", [since])
    if not there:
        raise expired_meanwhile(snapshot, what)
    for sid, made in sorted((int(r[0]), r[1]) for r in later):
        if not {kind for kind, _ in _changes(made)} <= _ROW_CHANGES:
            raise Cut(f"snapshot {sid} ({made}) moved the lake's files while {what} was read at snapshot "
                      f"{snapshot}: read it again", expired=False)


def _changes(made: str | None) -> list[tuple[str, str]]:
    """A snapshot's ``changes_made`` (``inlined_insert:12,created_table:...``) as (kind, what) pairs."""
    return [(kind, what) for kind, _, what in (part.partition(":") for part in (made or "").split(",") if part)]


def pinned(con: duckdb.DuckDBPyConnection, at: At, what: str, read: Callable[[int, int], T]) -> T:
    """``read(snapshot, begun)`` at the snapshot ``at`` stands for, pinned
    now (the latest when None; ``begun``: the latest now), then ``settled``:
    ``Cut`` when the catalog may have answered it short (read it again). A
    pinned latest that an erase expired before a statement reached it is
    such a cut; a snapshot ``at`` named is the caller's, refused
    (``SnapshotGone``).

    Each statement is a transaction of its own (DuckDB's autocommit). As one
    transaction for the whole read, DuckLake would read the catalog's
    snapshot table once instead of once a statement (85 ms a time at 600,000
    snapshots on SQLite), but a process compacting the lake beside readers
    that did so died inside DuckLake's maintenance calls (a corrupted heap,
    a segmentation fault): ``test_a_read_beside_compactions_is_never_short``
    crashed in 5 of 26 runs so, and in none of 24 with only the transaction
    taken out (docs/LAKE.md, "Tried and taken back")."""
    begun = latest_snapshot(con)
    snapshot = begun if at is None else snapshot_at(con, at)
    try:
        out = read(snapshot, begun)
    except SnapshotGone:
        if at is not None:
            raise
        raise expired_meanwhile(snapshot, what) from None
    settled(con, snapshot, begun, what)
    return out


def read_memories(con: duckdb.DuckDBPyConnection, dim: int, snapshot: int,
                  ids: list[str] | None = None) -> list[LakeMemory]:
    """The memories of ``snapshot``, all or those among ``ids``, sorted by id,
    with their topics, concepts and declared edges: statements for ``pinned``."""
    clause, params = _at(snapshot)
    where = ""
    if ids is not None:
        where = " WHERE {col} IN (SELECT unnest($ids))"
        params = {**params, "ids": list(ids)}
    rows = _run(con, "SELECT id, namespace, content, content_type, created_at, content_hash, embedding, "
                     f"metadata::VARCHAR, context, ingested_at FROM memories{clause}{where.format(col='id')} ORDER BY id",
                params)
    topics: dict[str, list[str]] = {}
    for mid, t in _run(con, f"SELECT memory_id, topic_key FROM memory_topics{clause}"
                            f"{where.format(col='memory_id')} ORDER BY 1, 2", params):
        topics.setdefault(mid, []).append(t)
    concepts: dict[str, list[str]] = {}
    for mid, c in _run(con, f"SELECT memory_id, concept FROM memory_concepts{clause}"
                            f"{where.format(col='memory_id')} ORDER BY 1, 2", params):
        concepts.setdefault(mid, []).append(c)
    edges: dict[str, list[tuple[str, str, str]]] = {}
    for src, dst, kind, origin in _run(con, f"SELECT src, dst, kind, origin FROM edges{clause}"
                                            f"{where.format(col='origin')} ORDER BY 4, 1, 2, 3", params):
        edges.setdefault(origin, []).append((src, dst, kind))
    vectors = vectors_of([r[6] for r in rows], dim)
    return [LakeMemory.from_row(dict(zip(TABLES["memories"], r)), vectors[i], topics.get(r[0], []),
                                concepts.get(r[0], []), edges.get(r[0], []))
            for i, r in enumerate(rows)]


def count(con: duckdb.DuckDBPyConnection, at: At = None) -> int:
    """How many memories the snapshot ``at`` holds (the latest when None)."""
    def read(snapshot: int, _: int) -> int:
        clause, params = _at(snapshot)
        return int(_run(con, f"SELECT count(*) FROM memories{clause}", params)[0][0])

    return pinned(con, at, "the count of memories", read)


def snapshot_at(con: duckdb.DuckDBPyConnection, at: At) -> int:
    """The snapshot id ``at`` stands for: itself, the last one committed by a
    time, or the latest."""
    if at is None:
        return latest_snapshot(con)
    if isinstance(at, int):
        _at(at)
        return at
    _, params = _at(at)
    row = one(con.execute(f"SELECT max(snapshot_id) FROM ducklake_snapshots('{LAKE}') WHERE snapshot_time <= $at",
                      params))
    if row is None or row[0] is None:
        raise InputError("as_of", f"no snapshot of the lake at or before {at.isoformat()}")
    return int(row[0])


# The kinds of change (``changes_made``) that name a table whose rows a
# snapshot inserted or deleted (by table id), and those that change no row of
# a table that exists before them. Any other (a table dropped or altered, a
# compaction: names this version may spell otherwise) makes a reader read
# every record table, as it did before this narrowing.
_NO_ROW_CHANGES = frozenset({"created_schema", "created_table"})


_INSERTS = frozenset({"inlined_insert", "inserted_into_table"})
_BOTH = frozenset({"insert", "delete"})


def changed_tables(con: duckdb.DuckDBPyConnection, since: int, until: int) -> dict[str, frozenset[str]]:
    """The record tables (of ``TABLES``) whose rows the snapshots after
    ``since`` up to ``until`` inserted or deleted, each with which of the two
    (``insert``, ``delete``), from one question to the catalog
    (``catalog.ask``): a write of new memories without concepts or edges is
    two reads of insertions instead of four of changes, an audit commit
    none. Every record table, both ways, when a snapshot in the range is gone
    (expired: ``changes_since`` then says so) or names a change this does not know."""
    every = dict.fromkeys(TABLES, _BOTH)
    rows = ask(con, "SELECT changes_made FROM ducklake_snapshot_changes WHERE snapshot_id > ? AND snapshot_id <= ?",
               [since, until])
    if len(rows) != until - since:
        return every
    ids: dict[str, set[str]] = {}
    for (made,) in rows:
        for kind, what in _changes(made):
            if kind in _ROW_CHANGES:
                ids.setdefault(what, set()).add("insert" if kind in _INSERTS else "delete")
            elif kind not in _NO_ROW_CHANGES:
                return every
    if not ids:
        return {}
    names = {str(tid): name for name, tid in ask(
        con, "SELECT table_name, table_id FROM ducklake_table WHERE end_snapshot IS NULL")}
    if not ids.keys() <= names.keys():
        return every  # a table dropped since: read them all
    out: dict[str, frozenset[str]] = {}
    for tid, kinds in ids.items():
        if names[tid] in TABLES:
            out[names[tid]] = out.get(names[tid], frozenset()) | kinds
    return {t: out[t] for t in TABLES if t in out}


def changes_since(con: duckdb.DuckDBPyConnection, since: int, until: int | None = None) -> Changes:
    """Rows inserted into and deleted from each record table by the snapshots
    after ``since`` up to ``until`` (the latest when None). An update is a
    delete and an insert of the same id. Raises ``StoreError`` when ``since``
    has expired: the caller reloads from a snapshot instead."""
    begun = latest_snapshot(con)  # a snapshot after it that moved files may have moved them under the read
    until = begun if until is None else until
    out = Changes(since=since, until=until, tables={name: TableChanges() for name in TABLES})
    if until <= since:
        return out
    tables = changed_tables(con, since, until)
    for table, kinds in tables.items():  # each a transaction of its own, as ``pinned``'s statements
        _table_changes(con, table, since, until, out.tables[table], kinds)
    settled(con, since + 1, begun, f"the changes {since + 1}..{until}")
    return out


def _table_changes(con: duckdb.DuckDBPyConnection, table: str, since: int, until: int, per: TableChanges,
                   kinds: frozenset[str] = _BOTH) -> None:
    """``table``'s rows inserted and deleted by the snapshots after ``since`` up to ``until``, into ``per``
    (``kinds``: only those the snapshots made, ``changed_tables``).

    Read as DuckLake's insertions and deletions, each in (snapshot, rowid)
    order: what ``ducklake_table_changes`` gives, less its pairing of a
    snapshot's delete and insert of one rowid as an update, which no reader
    uses (an update is a delete and an insert here). That pairing made it
    cost 21 ms for one snapshot at 10k memories, against 6 ms for the
    insertions alone (a write of new memories) and 16 ms for both."""
    columns = ", ".join(TABLES[table])
    names = TABLES[table]
    for kind, fn, into in (("delete", "ducklake_table_deletions", per.deleted),
                           ("insert", "ducklake_table_insertions", per.inserted)):
        if kind not in kinds:
            continue
        try:
            rows = con.execute(f"SELECT snapshot_id, {columns} FROM {fn}('{LAKE}', 'main', ?, ?, ?) "
                               "ORDER BY snapshot_id, rowid", [table, since + 1, until]).fetchall()
        except duckdb.InvalidInputException as exc:
            raise StoreError(f"the lake has no snapshot {since + 1}..{until} any more ({exc}): read the latest "
                             "snapshot in full") from None
        into.extend((int(snapshot), dict(zip(names, values, strict=True))) for snapshot, *values in rows)
