"""A write as one catalog transaction: idempotent by write id, retried on conflict.

Every write updates the one row of ``write_head``; two writes at once both
delete that row, so the catalog commits one and refuses the other (DuckLake's
conflict check for PostgreSQL, SQLite's write lock for a SQLite catalog), which
starts again on the newer snapshot. Writes are thus serialised as the single
writer's lock did, across processes and hosts, and none is lost: a refused
write is retried until ``deadline_s``. The write id is checked inside the
transaction, so a message delivered twice, even to two processes at once,
is applied once.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import duckdb

from pipeline.embedders import check_model, model_identity
from pipeline.errors import StoreError
from pipeline.store.database import utcnow
from pipeline.store.lake.catalog import LAKE, _is_conflict, ask, one
from pipeline.store.lake.records import Committed, LakeWrite, vector_bytes

_T = TypeVar("_T")


def retrying(con: duckdb.DuckDBPyConnection, step: Callable[[], _T], *, deadline_s: float, what: str) -> tuple[_T, int]:
    """``step()`` (one whole transaction), again after a conflict with another
    process's commit, with a growing random pause, until ``deadline_s`` has
    passed; (its result, the attempts it took). Any other error is raised at once,
    the transaction rolled back whatever it was (a Celery soft time limit
    between BEGIN and COMMIT left it open on the process's connection, whose
    next reads saw the uncommitted rows)."""
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return step(), attempt
        except duckdb.Error as exc:
            _rollback(con)
            if not _is_conflict(exc):
                raise
            waited = time.monotonic() - start
            if waited > deadline_s:
                raise StoreError(f"{what}: still refused by the catalog after {attempt} attempts "
                                 f"({waited:.1f} s): {exc}") from exc
            time.sleep(random.uniform(0.005, min(0.5, 0.01 * 2 ** min(attempt, 6))))
        except BaseException:  # a soft time limit, a KeyboardInterrupt, a bug: no transaction left open
            _rollback(con)
            raise


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass  # no transaction open: the failed COMMIT ended it


def commit(con: duckdb.DuckDBPyConnection, write: LakeWrite, *, deadline_s: float) -> Committed:
    """Apply ``write`` in one transaction and return the snapshot that holds it.

    Remembered memories replace any with the same id (their topics, concepts
    and declared edges with them); forgotten ones go with every edge that
    names them. A write id the lake already holds is a replay: nothing is
    written and the snapshot returned is that write's (or, if it has expired,
    the latest)."""
    asked = [m.id for m in write.remember] + list(dict.fromkeys(write.forget))
    targets = write.link_targets()

    def once() -> Committed:
        con.execute("BEGIN TRANSACTION")
        # one read of the catalog for every question: is this a replay, which ids are
        # live (the write's own and its links' targets), which model the lake holds
        done, found, meta = one(con.execute(
            "SELECT (SELECT count(*) FROM writes WHERE write_id = ?), "
            "(SELECT coalesce(list(id), []) FROM memories WHERE id IN (SELECT unnest(?))), "
            "(SELECT [max(value) FILTER (WHERE key = 'embedding_model'), max(value) FILTER (WHERE key = 'embedding_dim')] "
            "FROM lake_meta)", [write.write_id, asked + targets])) or (0, [], [None, None])
        if done:
            con.execute("ROLLBACK")
            return Committed(write.write_id, snapshot_of_write(con, write.write_id), replayed=True)
        live = set(found) & set(asked)
        try:
            _still_valid(write, set(targets) - set(found), meta)
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', ?)", [write.write_id])
        con.execute("UPDATE write_head SET seq = seq + 1")
        forgotten = _apply(con, write, live)
        if forgotten:  # not erased yet: compaction erases it within store.erase_within (erase.due)
            con.execute("INSERT INTO forgets SELECT seq, ? FROM write_head", [utcnow()])
        con.execute("INSERT INTO writes VALUES (?, ?, ?, ?)",
                    [write.write_id, utcnow(), len(write.remember), forgotten])
        con.execute("COMMIT")
        snapshot = one(con.execute(f"SELECT id FROM ducklake_last_committed_snapshot('{LAKE}')"))
        if snapshot is None or snapshot[0] is None:
            raise StoreError("the catalog named no snapshot for a committed write")
        return Committed(write.write_id, int(snapshot[0]), remembered=len(write.remember), forgotten=forgotten)

    result, attempts = retrying(con, once, deadline_s=deadline_s, what=f"write {write.write_id}")
    result.attempts = attempts
    return result


class LinkTargetGone(StoreError):
    """A write's link names a memory that is no longer live: another process
    forgot it after the write was validated. Nothing was committed; the writer
    validates again against a newer snapshot (``writes._write_lake``)."""

    def __init__(self, write_id: str, gone: list[str]):
        self.write_id, self.gone = write_id, list(gone)
        # ``args`` is what Celery sends (JSON) and rebuilds it from (``cls(*args)``),
        # as ``InputError``: one that outlasts ``write_wait_s`` reaches the caller typed
        super().__init__(write_id, self.gone)

    def __str__(self) -> str:
        return f"write {self.write_id}: its links name {self.gone}, forgotten since the write was validated"


def _still_valid(write: LakeWrite, gone: set[str], meta: list[str | None]) -> None:
    """What a write validated against an older snapshot must still hold at its
    commit, where a write committed in between can have changed it: every link
    target is live (``LinkTargetGone``), and the lake holds the model of the
    write's vectors (``ModelMismatchError``: a ``dimple reembed`` in between).
    Replaced memories and forgets need no check: the commit reads which ids
    are live itself, so a forget or replacement applies to what is there."""
    if gone:
        raise LinkTargetGone(write.write_id, sorted(gone))
    model, dim = meta
    if write.remember and model is not None and dim is not None:
        check_model(model_identity(model), int(dim), write.embedding_model,
                    int(write.remember[0].embedding.shape[0]), f"the lake (write {write.write_id})")


def _apply(con: duckdb.DuckDBPyConnection, write: LakeWrite, live: set[str]) -> int:
    """The write's rows, given which of its ids are ``live``; the number of live
    memories it forgot. A memory's topics, concepts and declared edges exist
    only while it does, so only live ids have rows to delete: a write of new
    memories deletes nothing (each delete is a read of the catalog)."""
    forget = [m for m in dict.fromkeys(write.forget) if m in live]
    if forget:
        con.execute("DELETE FROM edges WHERE src IN (SELECT unnest(?)) OR dst IN (SELECT unnest(?))", [forget, forget])
    gone = [m.id for m in write.remember if m.id in live] + forget
    if gone:
        con.execute("DELETE FROM memories WHERE id IN (SELECT unnest(?))", [gone])
        con.execute("DELETE FROM memory_topics WHERE memory_id IN (SELECT unnest(?))", [gone])
        con.execute("DELETE FROM memory_concepts WHERE memory_id IN (SELECT unnest(?))", [gone])
        con.execute("DELETE FROM edges WHERE origin IN (SELECT unnest(?))", [gone])
    forgotten = len(forget)
    ms = write.remember
    if not ms:
        return forgotten
    con.execute(
        "INSERT INTO memories (id, namespace, content, content_type, created_at, content_hash, embedding, metadata, "
        "context, ingested_at) SELECT unnest(?), unnest(?), unnest(?), unnest(?), unnest(?), unnest(?), unnest(?), "
        "unnest(?), unnest(?), unnest(?)",
        [[m.id for m in ms], [m.namespace for m in ms], [m.content for m in ms], [m.content_type for m in ms],
         [m.created_at for m in ms], [m.content_hash for m in ms], [vector_bytes(m.embedding) for m in ms],
         [m.metadata_json for m in ms], [m.context for m in ms], [m.ingested_at for m in ms]])
    topics = [(m.id, t) for m in ms for t in m.topics]
    if topics:
        con.execute("INSERT INTO memory_topics SELECT unnest(?), unnest(?)", [list(c) for c in zip(*topics)])
    concepts = [(m.id, c) for m in ms for c in m.concepts]
    if concepts:
        con.execute("INSERT INTO memory_concepts SELECT unnest(?), unnest(?)", [list(c) for c in zip(*concepts)])
    edges = [(src, dst, kind, m.id) for m in ms for src, dst, kind in m.edges]
    if edges:
        con.execute("INSERT INTO edges SELECT unnest(?), unnest(?), unnest(?), unnest(?)",
                    [list(c) for c in zip(*edges)])
    return forgotten


def index_message(write_id: str | None) -> str:
    """The commit message of a snapshot listing a base: ``index``, and the
    write's id when the base is that write's (a first or large write)."""
    return "index" if write_id is None else f"index {write_id}"


# The commit message that puts a re-embedding's vectors in place (``pipeline.store.reembed``),
# followed by the model: a reader whose base is older loads a base of the new model.
REEMBED_MESSAGE = "reembed"


# The commit message of the audit trail's own commits (``pipeline.audit.lake``:
# "audit", "audit purge", and "schema: audit" when it creates its tables): they
# change no record table, so a reader following the store passes over them.
AUDIT_MESSAGE = "audit"


def only_audit_since(con: duckdb.DuckDBPyConnection, since: int, until: int) -> bool:
    """Whether every snapshot after ``since`` up to ``until`` is an audit commit
    (one question to the catalog, ``catalog.ask``, instead of
    ``changes_since``'s one a table): ``only_audit`` of ``messages_since``."""
    return only_audit(messages_since(con, since, until))


def messages_since(con: duckdb.DuckDBPyConnection, since: int, until: int) -> list[str | None] | None:
    """The commit messages of the snapshots after ``since`` up to ``until``
    (``catalog.ask``). Snapshot ids count up by one: None when one of them
    has expired (an erase or ``store.retain``), its changes unknown."""
    rows = ask(con, "SELECT commit_message FROM ducklake_snapshot_changes WHERE snapshot_id > ? AND snapshot_id <= ?",
               [since, until])
    return [r[0] for r in rows] if len(rows) == until - since else None


def only_audit(messages: list[str | None] | None) -> bool:
    """Whether ``messages_since``'s snapshots are all audit commits (an expired one: no)."""
    return messages is not None and all(_audit_message(m) for m in messages)


def lists_a_base(messages: list[str | None] | None) -> bool:
    """Whether one of ``messages_since``'s snapshots may have listed a base
    (``index_message``; an expired one may have): a reader looks for a newer
    base (``indexes``, a lake read) only then."""
    return messages is None or any(m is not None and (m == "index" or m.startswith("index ")) for m in messages)


def _audit_message(message: str | None) -> bool:
    m = message or ""
    return m in (AUDIT_MESSAGE, f"schema: {AUDIT_MESSAGE}") or m.startswith(f"{AUDIT_MESSAGE} ")


def snapshot_of_write(con: duckdb.DuckDBPyConnection, write_id: str) -> int:
    """The snapshot that committed ``write_id`` (its commit message) or, for a
    write that built a base, the one that listed it (the state the write
    published); the latest when that snapshot has expired."""
    row = one(con.execute(f"SELECT max(snapshot_id) FROM ducklake_snapshots('{LAKE}') WHERE commit_message IN (?, ?)",
                      [write_id, index_message(write_id)]))
    if row is not None and row[0] is not None:
        return int(row[0])
    return latest_snapshot(con)


def latest_snapshot(con: duckdb.DuckDBPyConnection) -> int:
    """The newest committed snapshot id, asked of the catalog now
    (``catalog.ask``: DuckLake's ``ducklake_current_snapshot`` is the same
    ``max``, behind a read of the whole snapshot table on SQLite)."""
    rows = ask(con, "SELECT max(snapshot_id) FROM ducklake_snapshot")
    if not rows or rows[0][0] is None:
        raise StoreError("the lake catalog holds no snapshot")
    return int(rows[0][0])
