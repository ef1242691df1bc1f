"""Forgetting for good: after ``erase`` no file under the data path and no row
of the catalog holds a byte of the erased memories, and no snapshot that
showed them can be read any more.

DuckLake never rewrites a file in place: a delete only marks rows deleted
(inlined rows keep their bytes in the catalog, Parquet rows in their file) so
that older snapshots still read them. Erasing therefore (1) moves inlined rows
to Parquet (``ducklake_flush_inlined_data``), (2) rewrites every file with
deleted rows without them (``ducklake_rewrite_data_files``) and merges small
files (``ducklake_merge_adjacent_files``), (3) expires every snapshot older
than the result (``ducklake_expire_snapshots``), (4) deletes the files no
snapshot needs (``ducklake_cleanup_old_files``) and files no commit ever
listed and are an hour old (a writer killed mid-write, ``ducklake_delete_orphaned_files``), and
(5) has the catalog database drop the deleted rows' pages (SQLite ``VACUUM``;
PostgreSQL ``VACUUM FULL`` of the lake's tables). Steps 1-2 are ``rewrite``,
3-5 ``cut``: compaction builds and lists its base between them.

A compaction that died midway (DuckLake's maintenance calls crash now and
then) may have left a file no commit lists holding rows the erase must
remove (its flush writes the deleted inlined rows too), and so may a writer
killed before its commit (a batch writes its Parquet file first, and a write
sent again commits the same memory in a file of its own). Such a file is
deleted only once ``LONGEST_TRANSACTION`` old. While one remains, ``cut``
leaves the forgets listed and the next erase waits until it can be deleted
(``erase_due``): the bound is then passed, not broken in silence.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb

from pipeline.errors import StoreError
from pipeline.store.lake.catalog import LAKE, META, Catalog, _quote, load_extensions, one
from pipeline.store.lake.commit import latest_snapshot, retrying

log = logging.getLogger("dimple.lake")

# The longest a transaction on the lake may run (a base built at 1M reads for
# ~9 min). A Parquet file no commit lists is deleted once it is this old:
# younger ones may belong to a write still in progress (a large batch writes
# its files before it commits). A file a merge replaced is deleted once it was
# replaced this long ago: DuckLake schedules it for deletion at the merge,
# while a reader that planned its scan before the merge may still be reading
# it (deleted at once, such a read failed: "Cannot open file", seen on three
# hosts, ``ops/bench/host_kills.py``).
LONGEST_TRANSACTION = timedelta(hours=1)
# How long the catalog's clean-up waits for readers: PostgreSQL's VACUUM FULL
# for one table's lock, SQLite's VACUUM and WAL checkpoint for readers to let go
# (readers' transactions are short; a longer wait would hold writers up behind it).
LOCK_WAIT = timedelta(seconds=30)
# A dead compaction's files carry the clock of the host that wrote them (or of
# the file server), its ``found_at`` the clock of the host that took its claim
# over: a file up to this much younger than ``found_at`` still counts as the
# dead one's.
CLOCK_SLACK = timedelta(minutes=5)


# An erase is due once the oldest forget not yet erased is this share of
# ``store.erase_within`` old: the rest of the bound leaves room for the next
# check (``CHECK_EVERY`` at most, a twentieth of the bound) and a compaction.
# History is then cut at most once per 0.9 of the bound.
ERASE_AT = 0.9
CHECK_EVERY = timedelta(minutes=1)
# Snapshots named in one ``ducklake_expire_snapshots`` call (an erase after a
# quiet week may cut hundreds of thousands: they are named in batches).
EXPIRE_BATCH = 5000


@dataclass(frozen=True)
class Rewritten:
    """What ``rewrite`` leaves for ``cut``: the ``write_head`` seq read first
    (every forget up to it is erased once ``cut`` is done) and the files no
    commit listed before the rewrite began (``cut`` tells a write that died
    from one in progress by them)."""

    covered: int
    orphans: frozenset[str]


@dataclass
class Purged:
    """What ``purge`` did: the snapshot the lake is left at, snapshots expired,
    files deleted; ``held_until`` (naive UTC): set when files a dead compaction
    left may hold erased bytes, so the forgets stay listed for an erase then
    (``cut``)."""

    snapshot: int
    expired: int = 0
    files_deleted: int = 0
    held_until: datetime | None = None
    # set by a ``cut(mark=False)`` that found nothing to wait for: the forgets up to
    # seq ``covered`` (and the dead compactions found up to ``found``) to mark erased
    # once the caller has removed its own copies (``mark_erased``)
    covered: int | None = None
    found: datetime | None = None


def _call(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> int:
    """Rows a maintenance table function returned (files or snapshots it handled)."""
    return len(con.execute(sql, params or []).fetchall())


def purge(con: duckdb.DuckDBPyConnection, catalog: Catalog, extensions_dir: Path, *, deadline_s: float) -> Purged:
    """Leave only the latest snapshot and the files it reads, and drop deleted
    rows' bytes from the catalog database (the steps in the module's text):
    ``rewrite``, then ``cut`` at the latest snapshot. Compaction builds and
    lists its base between the two (``compaction``), so that readers whose base
    the cut expires find the new one listed.

    Each step is its own catalog transaction, retried when a write commits
    at the same moment; a write committed during the purge survives it (the
    expiry keeps the latest snapshot, whichever it is by then)."""
    rewritten = rewrite(con, deadline_s=deadline_s)
    return cut(con, catalog, extensions_dir, rewritten=rewritten, keep=latest_snapshot(con), deadline_s=deadline_s)


def _step(con: duckdb.DuckDBPyConnection, deadline_s: float, sql: str, params: list | None = None,
          what: str = "purge") -> int:
    return retrying(con, lambda: _call(con, sql, params), deadline_s=deadline_s, what=what)[0]


def rewrite(con: duckdb.DuckDBPyConnection, *, deadline_s: float) -> Rewritten:
    """Steps 1-2: every deleted row out of the files the latest snapshot reads
    (inlined rows flushed, files with deleted rows rewritten, small files
    merged). Older snapshots still read the old files. Returns the
    ``write_head`` seq read first (every forget up to it is in the state
    rewritten, erased once ``cut`` is done; a forget committed meanwhile stays
    listed for the next erase) and the files no commit lists yet."""
    covered = head_seq(con)
    orphans = frozenset(_orphans(con))
    retrying(con, lambda: _drop_staged(con), deadline_s=deadline_s, what="purge")
    _step(con, deadline_s, f"SELECT * FROM ducklake_flush_inlined_data('{LAKE}')")
    _step(con, deadline_s, f"SELECT * FROM ducklake_rewrite_data_files('{LAKE}', delete_threshold => 0)")
    _step(con, deadline_s, f"SELECT * FROM ducklake_merge_adjacent_files('{LAKE}')")
    return Rewritten(covered, orphans)


def _drop_staged(con: duckdb.DuckDBPyConnection) -> None:
    """The vectors a stopped ``dimple reembed`` staged for memories forgotten
    since (``reembedded``): deleted, so the rewrite erases them with the
    memories (a forget does not touch the table: the erase is its one reader)."""
    con.execute("BEGIN TRANSACTION")
    con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'compaction')")
    con.execute("DELETE FROM reembedded WHERE id NOT IN (SELECT id FROM memories)")
    con.execute("COMMIT")


def cut(con: duckdb.DuckDBPyConnection, catalog: Catalog, extensions_dir: Path, *, rewritten: Rewritten, keep: int,
        deadline_s: float, mark: bool = True) -> Purged:
    """Steps 3-5, after ``rewrite``: every snapshot before ``keep`` (one taken
    after the rewrite) expired, the files only they read and files no commit
    lists deleted, the catalog database vacuumed; then the forgets up to
    ``rewritten.covered`` are marked erased (last: a vacuum that failed leaves
    them due, so the next compaction erases again), unless a file a compaction
    or a write that died left may hold their bytes: then they wait for it
    (``held_until``). ``mark=False``: not marked here; the caller calls
    ``mark_erased`` once its own copies outside the lake are gone too (a
    compaction's older bases), so that dying before that leaves the erase due."""
    # by id, not by time: ``older_than`` the kept one's time expires that one too, and a
    # snapshot stamped by a host whose clock runs ahead would escape it
    older = [int(r[0]) for r in con.execute(f"SELECT snapshot_id FROM ducklake_snapshots('{LAKE}') "
                                            "WHERE snapshot_id < ? ORDER BY 1", [keep]).fetchall()]
    expired = _expire(con, older, deadline_s)
    deleted = _step(con, deadline_s, f"SELECT * FROM ducklake_cleanup_old_files('{LAKE}', cleanup_all => true)")
    deleted += _delete_old_orphans(con, deadline_s)
    orphans = _orphans(con)
    found, suspects = _left_by_the_dead(con, orphans)
    died = _writes_that_died(con, rewritten, orphans)
    if died:  # recorded as the dead compactions are: the wait for their files is the same
        found = max(at for at in (found, *died.values()) if at is not None)
        suspects = sorted({*suspects, *died})
    vacuum_catalog(catalog, extensions_dir)
    if found is not None and suspects:
        if datetime.now(UTC).replace(tzinfo=None) >= _waits_until(found):  # step 4 should have deleted them
            raise _still_there(suspects)
        retrying(con, lambda: _hold(con, found, died), deadline_s=deadline_s, what="purge")
        until = (_waits_until(found) + timedelta(microseconds=999_999)).replace(microsecond=0)  # a whole second
        log.warning("erase: %d file(s) a compaction or a write that died left may hold erased bytes (%s); they "
                    "can be deleted, and the erase completed, from %s UTC: the forgets stay listed until then",
                    len(suspects), ", ".join(suspects[:3]), until.isoformat(timespec="seconds"))
        return Purged(snapshot=latest_snapshot(con), expired=expired, files_deleted=deleted, held_until=until)
    done = Purged(snapshot=latest_snapshot(con), expired=expired, files_deleted=deleted, covered=rewritten.covered,
                  found=found)
    if mark:
        mark_erased(con, done, deadline_s=deadline_s)
    return done


def mark_erased(con: duckdb.DuckDBPyConnection, done: Purged, *, deadline_s: float) -> None:
    """The forgets ``done`` (a ``cut``) covered marked erased; nothing when it waits (``held_until``)."""
    if done.covered is None or done.held_until is not None:
        return
    covered, found = done.covered, done.found
    retrying(con, lambda: _erased(con, covered, found), deadline_s=deadline_s, what="purge")


def _still_there(suspects: list[str]) -> StoreError:
    return StoreError(f"erase: {len(suspects)} file(s) no commit lists, which a compaction or a write that died may "
                      f"have left holding forgotten bytes, are over {LONGEST_TRANSACTION} old and still there "
                      f"({', '.join(suspects[:3])}): step 4 could not delete them (permissions? a clock ahead?); "
                      "delete them by hand and run `dimple compact` (the forgets stay listed)")


def check_the_dead(con: duckdb.DuckDBPyConnection, *, deadline_s: float) -> None:
    """Before an erase, when the wait for files the dead left is over: step 4
    alone (the files no commit lists, an hour old, deleted), and ``StoreError``
    naming those still there, as ``cut`` would after a whole compaction. Each
    check that finds the erase due (a minute) then costs a listing, not a base
    built and every file rewritten, until an operator deletes them. The wait is
    ``cut``'s: from the newest death recorded, held or not (a retry's claim
    that just recorded one makes the younger files suspects, and ``cut`` waits
    for them; an erase that failed past its wait never held its rows)."""
    found, _ = _left_by_the_dead(con, [])
    if found is None or datetime.now(UTC).replace(tzinfo=None) < _waits_until(found):
        return
    _delete_old_orphans(con, deadline_s)
    _, suspects = _left_by_the_dead(con, _orphans(con))
    if suspects:
        raise _still_there(suspects)


def _waits_until(found: datetime) -> datetime:
    """When files a compaction found dead at ``found`` left can be deleted (step 4): an erase waits until then."""
    return found + LONGEST_TRANSACTION + CLOCK_SLACK


def _delete_old_orphans(con: duckdb.DuckDBPyConnection, deadline_s: float) -> int:
    """Step 4's second half: the files no commit lists that are ``LONGEST_TRANSACTION``
    old deleted (younger ones may be a write in progress); how many."""
    return _step(con, deadline_s, f"SELECT * FROM ducklake_delete_orphaned_files('{LAKE}', "
                                  "older_than => now() - ?::INTERVAL)", [timedelta_text(LONGEST_TRANSACTION)])


def _orphans(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The files under the data path that no commit lists, whatever their age."""
    return [str(r[0]) for r in con.execute(f"SELECT path FROM ducklake_delete_orphaned_files('{LAKE}', "
                                           "cleanup_all => true, dry_run => true)").fetchall()]


def _left_by_the_dead(con: duckdb.DuckDBPyConnection, orphans: list[str]) -> tuple[datetime | None, list[str]]:
    """The latest ``found_at`` of ``dead_compactions`` (None: none recorded)
    and those of ``orphans`` older than it (``CLOCK_SLACK`` allowed): what a
    compaction (or a write, ``_writes_that_died``) that died may have left.
    Younger ones are writes in progress or left by a later writer."""
    row = one(con.execute("SELECT max(found_at) FROM dead_compactions"))
    found = row[0] if row else None
    if found is None:
        return None, []
    before = (found + CLOCK_SLACK).replace(tzinfo=UTC).timestamp()
    return found, [p for p in orphans if _written_before(p, before)]


def _writes_that_died(con: duckdb.DuckDBPyConnection, rewritten: Rewritten, orphans: list[str]) -> dict[str, datetime]:
    """The files no commit listed before the rewrite and none lists after step
    4 (a write in progress commits, or fails and deletes its files, within the
    compaction; a batch so long that it does not is taken for dead and only
    holds the erase) written before the newest forget ``cut`` erases was
    committed (``CLOCK_SLACK`` allowed: the files carry another host's clock):
    left by a writer killed before its commit, they may hold a forgotten
    memory that a write sent again committed. By path: when each was last
    written (naive UTC; now for one this process cannot look at)."""
    row = one(con.execute("SELECT max(forgotten_at) FROM forgets WHERE seq <= ?", [rewritten.covered]))
    newest = row[0] if row else None
    if newest is None:
        return {}
    before = (newest + CLOCK_SLACK).replace(tzinfo=UTC).timestamp()
    died = {}
    for path in set(orphans) & rewritten.orphans:
        if _written_before(path, before):
            try:
                written = datetime.fromtimestamp(os.stat(path).st_mtime, UTC).replace(tzinfo=None)
            except OSError:
                written = datetime.now(UTC).replace(tzinfo=None)
            died[path] = written
    return died


def _written_before(path: str, before: float) -> bool:
    """Whether the file no commit lists at ``path`` was last written before
    ``before`` (seconds since the epoch). One gone since it was listed holds
    nothing; one this process cannot look at (a URL: ``s3://...``) counts as
    old: it may be the dead one's. A relative path (a relative
    ``store.data_path``) is local: DuckDB and ``os.stat`` read it from the same
    working directory."""
    if "://" in path:
        return True
    try:
        return os.stat(path).st_mtime <= before
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _hold(con: duckdb.DuckDBPyConnection, found: datetime, died: dict[str, datetime]) -> None:
    """The dead compactions found up to ``found``, and the writes that died
    (``_writes_that_died``: a row each, holder ``write:FILE``, found when the
    file was written), left files an erase waits for."""
    con.execute("BEGIN TRANSACTION")
    con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'erase held')")
    for path, written in sorted(died.items()):
        con.execute("INSERT INTO dead_compactions VALUES (?, ?, true)", [f"write:{path}", written])
    con.execute("UPDATE dead_compactions SET held = true WHERE found_at <= ?", [found])
    con.execute("COMMIT")


def _expire(con: duckdb.DuckDBPyConnection, ids: list[int], deadline_s: float, what: str = "purge") -> int:
    """Expire the snapshots ``ids``, named in batches of ``EXPIRE_BATCH``."""
    expired = 0
    for i in range(0, len(ids), EXPIRE_BATCH):
        expired += _step(con, deadline_s, f"SELECT * FROM ducklake_expire_snapshots('{LAKE}', versions => ?)",
                         [ids[i:i + EXPIRE_BATCH]], what)
    return expired


def head_seq(con: duckdb.DuckDBPyConnection) -> int:
    """``write_head``'s seq: every write committed so far has one at most this."""
    row = one(con.execute("SELECT max(seq) FROM write_head"))
    return int(row[0]) if row and row[0] is not None else 0


def _erased(con: duckdb.DuckDBPyConnection, covered: int, found: datetime | None) -> None:
    """The forgets of writes up to seq ``covered`` are erased: their rows go,
    and so do the dead compactions found up to ``found`` (nothing they left remains)."""
    con.execute("BEGIN TRANSACTION")
    con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'erased')")
    con.execute("DELETE FROM forgets WHERE seq <= ?", [covered])
    if found is not None:
        con.execute("DELETE FROM dead_compactions WHERE found_at <= ?", [found])
    con.execute("COMMIT")


@dataclass
class EraseState:
    """The forgets not yet erased (``waiting``; the oldest committed at
    ``oldest``) and, while an erase waits for a dead compaction's files
    (``cut``), until when (``held_until``); times naive UTC."""

    waiting: int
    oldest: datetime | None
    held_until: datetime | None


def erase_state(con: duckdb.DuckDBPyConnection) -> EraseState:
    """The lake's ``EraseState``, in one read of its catalog."""
    waiting, oldest, found = one(con.execute(
        "SELECT (SELECT count(*) FROM forgets), (SELECT min(forgotten_at) FROM forgets), "
        "(SELECT max(found_at) FROM dead_compactions WHERE held)")) or (0, None, None)
    return EraseState(int(waiting or 0), oldest, None if found is None else _waits_until(found))


def erase_due(con: duckdb.DuckDBPyConnection, erase_within: timedelta, now: datetime) -> bool:
    """Whether the lake ``con`` reads has an erase due (``due`` of its ``erase_state``)."""
    state = erase_state(con)
    return due(state.oldest, erase_within, now, state.held_until)


def due(oldest: datetime | None, erase_within: timedelta, now: datetime, held: datetime | None = None) -> bool:
    """Whether an erase is due: the oldest un-erased forget (``oldest``) is
    ``ERASE_AT`` of ``erase_within`` old, so that the erase, begun at the next
    check (``check_every``) and done within a compaction, ends inside the bound;
    and no erase waits (until ``held``) for a dead compaction's files."""
    return oldest is not None and now >= due_from(oldest, erase_within) and (held is None or now >= held)


def due_from(oldest: datetime, erase_within: timedelta) -> datetime:
    """When an erase of the forget committed at ``oldest`` is due (``due``, held or not)."""
    return oldest + erase_within * ERASE_AT


def check_every(erase_within: timedelta) -> timedelta:
    """How often a process that keeps the lake (an ingest worker) asks whether an erase is due."""
    return min(CHECK_EVERY, erase_within / 20)


def expire(con: duckdb.DuckDBPyConnection, catalog: Catalog, retain: timedelta, *, deadline_s: float) -> Purged:
    """Expire the snapshots older than ``retain`` (``store.retain``) and delete
    the files no snapshot has read for ``LONGEST_TRANSACTION`` (a merge just
    now replaced some that running reads may still scan; ``cleanup_cutoff``):
    the routine clean-up after a compaction. An erase (``cut``) deletes at
    once: it must."""
    # by id, the times compared here: on a SQLite catalog DuckLake's own `older_than`
    # compares by day, and expired every snapshot of the cutoff's day (with a
    # `retain` of an hour, at 04:00, all of the day's). The latest is never named.
    now = datetime.now(UTC)
    older = [int(r[0]) for r in con.execute(
        f"SELECT snapshot_id FROM ducklake_snapshots('{LAKE}') WHERE snapshot_time < ?::TIMESTAMPTZ "
        "AND snapshot_id < ? ORDER BY 1", [now - retain, latest_snapshot(con)]).fetchall()]
    expired = _expire(con, older, deadline_s, "expire")
    deleted = _step(con, deadline_s, f"SELECT * FROM ducklake_cleanup_old_files('{LAKE}', older_than => ?::TIMESTAMPTZ)",
                    [cleanup_cutoff(con, catalog, now)], "expire")
    return Purged(snapshot=latest_snapshot(con), expired=expired, files_deleted=deleted)


def cleanup_cutoff(con: duckdb.DuckDBPyConnection, catalog: Catalog, now: datetime) -> datetime:
    """The ``older_than`` of the routine clean-up: files scheduled for deletion
    before it go. ``now - LONGEST_TRANSACTION`` on PostgreSQL. On a SQLite
    catalog DuckLake (1.5.5) compares ``schedule_start`` by day: a file
    scheduled at any time of day D counts as scheduled at D 00:00
    (``tests/unit/test_lake_cleanup.py`` pins it), so ``now - 1 h`` would take
    files replaced a moment ago from 01:00 on. There the cutoff stays before
    the day the youngest-but-kept file was scheduled: correct under either
    reading, at the cost of keeping replaced files up to a day longer."""
    cutoff = now - LONGEST_TRANSACTION
    if catalog.kind != "sqlite":
        return cutoff
    row = one(con.execute(f"SELECT min(schedule_start::TIMESTAMPTZ) FROM {META}.ducklake_files_scheduled_for_deletion "
                          "WHERE schedule_start::TIMESTAMPTZ >= ?::TIMESTAMPTZ", [cutoff]))
    young = row[0] if row else None
    if young is None:
        return cutoff
    midnight = young.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return min(cutoff, midnight - timedelta(microseconds=1))


def timedelta_text(value: timedelta) -> str:
    """``value`` as a DuckDB interval literal (whole microseconds)."""
    return f"{int(value / timedelta(microseconds=1))} microseconds"


def vacuum_catalog(catalog: Catalog, extensions_dir: Path) -> None:
    """Have the catalog database rewrite its pages without deleted rows: a
    deleted row's bytes otherwise stay in a free page (SQLite) or a dead tuple
    (PostgreSQL) until reused."""
    if catalog.kind == "sqlite":
        _vacuum_sqlite(catalog)
        return
    _vacuum_postgres(catalog, extensions_dir)


# Run in a process of its own: SQLite's locks on the catalog are POSIX record
# locks, which belong to the process, and this process's DuckDB holds the
# catalog open through its own copy of SQLite (the sqlite extension). Python's
# sqlite3 in this process would take the WAL's shared memory for unused (the
# other copy's locks are this process's own), reset it under DuckDB's mapping
# (a SIGBUS at DuckDB's next catalog read, seen once in the test suite), empty
# the WAL under this process's readers, and on closing drop the other copy's
# locks. Exit 3: the WAL could not be emptied within the wait.
_VACUUM_SCRIPT = """
import sqlite3, sys, time
path, wait = sys.argv[1], float(sys.argv[2])
try:
    db = sqlite3.connect(path, timeout=wait)
    db.execute("VACUUM")
    # the WAL holds the old pages too; a reader in the middle of a read keeps
    # the checkpoint from truncating it (busy = 1): wait for it
    deadline = time.monotonic() + wait
    while (db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone() or (1,))[0]:
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.05)
    db.close()
except sqlite3.Error as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""


def _vacuum_sqlite(catalog: Catalog) -> None:
    """SQLite: VACUUM, then empty the WAL, in a child process (``_VACUUM_SCRIPT``)."""
    wait = LOCK_WAIT.total_seconds()
    try:
        done = subprocess.run([sys.executable, "-c", _VACUUM_SCRIPT, catalog.target, str(wait)],
                              capture_output=True, text=True, timeout=3 * wait + 60, check=False)
    except subprocess.TimeoutExpired as exc:  # killed by run(): the catalog is as SQLite left it
        raise StoreError(f"store.catalog: {catalog.target} was not vacuumed within {exc.timeout:.0f} s; "
                         "the erase runs again at the next compaction") from None
    if done.returncode == 3:
        raise StoreError(f"store.catalog: {catalog.target}'s WAL could not be emptied in {wait:.0f} s "
                         "(a reader held it); erase again")
    if done.returncode != 0:  # e.g. still locked by a writer after LOCK_WAIT
        reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
        raise StoreError(f"store.catalog: {catalog.target} could not be vacuumed ({reason}); "
                         "the erase runs again at the next compaction")


def _vacuum_postgres(catalog: Catalog, extensions_dir: Path) -> None:
    # From a connection of its own: the lake's connection opens a catalog
    # transaction with every statement, which VACUUM FULL would wait on. A
    # reader's open transaction makes it wait too, LOCK_WAIT at most a table.
    admin = duckdb.connect()
    try:
        load_extensions(admin, catalog, extensions_dir, ducklake=False)
        admin.execute("SET pg_pool_max_connections = 1")  # one session: the SET below holds for each VACUUM
        admin.execute(f"ATTACH {_quote(catalog.target)} AS catalog_admin (TYPE postgres)")
        tables = [r[0] for r in admin.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'catalog_admin' "
            "AND table_name LIKE 'ducklake%'").fetchall()]
        admin.execute("CALL postgres_execute('catalog_admin', ?, use_transaction => false)",
                      [f"SET lock_timeout = {int(LOCK_WAIT.total_seconds() * 1000)}"])
        for table in tables:
            # the names are DuckLake's own (ducklake_...), quoted as identifiers
            admin.execute("CALL postgres_execute('catalog_admin', ?, use_transaction => false)",
                          ['VACUUM FULL "' + table.replace('"', '""') + '"'])
    finally:
        admin.close()
