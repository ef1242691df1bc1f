"""Compaction of the lake (``store.engine = lake``; docs/LAKE.md, "Derived
indexes" and "Forget means erased"): what ``compact()`` and ``dimple compact``
do on the lake, and what a write that makes one due sends (``ingest.compact``).

One at a time across processes and hosts: a compaction claims the one row of
``compaction_head`` in a transaction of its own (two claims at once both
update it: the catalog commits one, the other finds it held) and gives it
back when done; a claim older than ``LEASE`` (a compaction killed midway) is
taken over. Holding it, a compaction

1. moves inlined rows to Parquet and merges small files
   (``ducklake_flush_inlined_data``, ``ducklake_merge_adjacent_files``);
2. erases, when an erase is due (``erase.due``: a forget not erased for most
   of ``store.erase_within``): ``erase.purge`` (every deleted row's bytes out
   of the files and the catalog, every older snapshot expired); otherwise
   expires the snapshots older than ``store.retain`` (``erase.expire``);
3. builds a base at the latest snapshot (``derive.build_base``, into
   ``store.index_path``) and lists it in ``indexes``, where every process
   finds it and loads it in the background (``follow``);
4. deletes the bases no one needs any more, file and row: after an erase all
   but the new one (they may hold an erased memory), else those whose
   snapshot has expired (no reader can bring them up to date).

The base is built after the erase, at a snapshot the erase kept: a reader can
merge the snapshots after it.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from datetime import timedelta

import duckdb

from pipeline.errors import StoreError
from pipeline.settings import Settings
from pipeline.store import segments
from pipeline.store.compact import CompactReport
from pipeline.store.database import utcnow
from pipeline.store.lake import erase as erasing
from pipeline.store.lake.catalog import LAKE, extensions_dir
from pipeline.store.lake.commit import retrying
from pipeline.store.lake.follow import Follower, bases, index_dir, listed
from pipeline.store.lake.store import Lake

# A claim of compaction_head this old is a compaction that died: another may
# take over. Longer than a compaction of a large store takes (a base of 1M
# memories is clustered whole); two compactions at once would still be
# correct, only wasteful (each step is its own retried transaction).
LEASE = timedelta(minutes=30)


def claim(lake: Lake, holder: str) -> bool:
    """Claim ``compaction_head`` for ``holder``: False when another compaction holds it."""
    def once() -> bool:
        con = lake.con
        now = utcnow()
        con.execute("BEGIN TRANSACTION")
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'compaction')")
        row = con.execute("UPDATE compaction_head SET seq = seq + 1, holder = ?, claimed_at = ? "
                          "WHERE holder IS NULL OR claimed_at < ?", [holder, now, now - LEASE]).fetchone()
        con.execute("COMMIT")
        return bool(row and row[0])

    return retrying(lake.con, once, deadline_s=lake.settings.write_wait_s, what="claiming the compaction")[0]


def release(lake: Lake, holder: str) -> None:
    """Give ``compaction_head`` back (if ``holder`` still holds it)."""
    def once() -> None:
        con = lake.con
        con.execute("BEGIN TRANSACTION")
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'compaction')")
        con.execute("UPDATE compaction_head SET holder = NULL, claimed_at = NULL WHERE holder = ?", [holder])
        con.execute("COMMIT")

    retrying(lake.con, once, deadline_s=lake.settings.write_wait_s, what="ending the compaction")


def erase_due(lake: Lake) -> bool:
    """Whether a forget has waited long enough that compaction must erase it now."""
    return erasing.due(erasing.oldest_forget(lake.con), lake.settings.store.erase_within, utcnow())


def _changed_since(lake: Lake, snapshot: int) -> bool:
    """Whether a write committed after ``snapshot`` (True when it has expired)."""
    try:
        row = lake.con.execute("SELECT (SELECT count(*) FROM writes) - (SELECT count(*) FROM writes "
                               "AT (VERSION => ?))", [snapshot]).fetchone()
    except duckdb.Error:
        return True
    return bool(row and row[0])


def compact_lake(settings: Settings, *, wait: bool = False, rebuild: bool = False,
                 follower: Follower | None = None) -> CompactReport:
    """Compact the lake ``settings`` name (the module's steps). Without ``wait``
    it returns at once (``ran`` False) when another compaction holds the
    claim; with it, it waits up to ``write_wait_s`` for that one to end. With
    nothing written since the newest base and no erase due it only deletes
    bases no one needs (``ran`` False), unless ``rebuild`` (a base is built
    whole from the records either way: ``rebuild`` only forces one)."""
    t0 = time.perf_counter()
    own = follower is None
    follower = follower or Follower(settings)
    try:
        lake = follower.lake()
        if lake is None:
            return CompactReport(ran=False)  # nothing written yet
        holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + settings.write_wait_s
        with follower.lock:
            held = claim(lake, holder)
        while not held:
            if not wait:
                return CompactReport(version=lake.latest_snapshot(), ran=False)
            if time.monotonic() > deadline:
                raise StoreError(f"compaction: another compaction held the lake for over {settings.write_wait_s:.0f} s "
                                 "(write_wait_s)")
            time.sleep(0.2)
            with follower.lock:
                held = claim(lake, holder)
        try:
            with follower.lock:
                report = _compact(lake, follower, settings, rebuild)
        finally:
            with follower.lock:
                release(lake, holder)
        report.seconds = time.perf_counter() - t0
        return report
    finally:
        if own:
            follower.close()


def _compact(lake: Lake, follower: Follower, settings: Settings, rebuild: bool) -> CompactReport:
    deadline = settings.write_wait_s
    held = listed(lake)
    newest = max(held, default=None)
    erase = erase_due(lake)
    if newest is not None and not erase and not rebuild and not _changed_since(lake, newest):
        removed = _drop_bases(lake, keep=newest, everything_older=False)
        return CompactReport(version=lake.latest_snapshot(), base=held[newest].name, removed=removed, ran=False)
    forgotten = int((lake.con.execute("SELECT count(*) FROM forgets").fetchone() or (0,))[0]) if erase else 0

    def step(sql: str) -> int:
        return retrying(lake.con, lambda: len(lake.con.execute(sql).fetchall()), deadline_s=deadline,
                        what="compaction")[0]

    if erase:  # flushes and merges too
        erasing.purge(lake.con, lake.catalog, extensions_dir(settings), deadline_s=deadline)
    else:
        step(f"SELECT * FROM ducklake_flush_inlined_data('{LAKE}')")
        step(f"SELECT * FROM ducklake_merge_adjacent_files('{LAKE}')")
        lake.expire()
    snapshot = lake.latest_snapshot()
    path = follower.build(snapshot)
    removed = _drop_bases(lake, keep=snapshot, everything_older=erase)
    return CompactReport(version=lake.latest_snapshot(), base=path.name,
                         memories=lake.count(at=snapshot), forgotten=forgotten, removed=removed)


def _drop_bases(lake: Lake, *, keep: int, everything_older: bool) -> list[str]:
    """Delete the bases other than ``keep``'s that no reader needs: all of them
    (``everything_older``: after an erase they may hold an erased memory), else
    those whose snapshot has expired. Their files go first, then their rows."""
    alive = {int(r[0]) for r in lake.con.execute(f"SELECT snapshot_id FROM ducklake_snapshots('{LAKE}')").fetchall()}
    rows = lake.con.execute("SELECT DISTINCT snapshot, path FROM indexes").fetchall()
    folder = index_dir(lake.settings)
    drop = [(int(s), name) for s, name in rows
            if int(s) < keep and (everything_older or int(s) not in alive)]
    if everything_older:  # and any base file no row lists (a builder that died before listing it)
        unlisted = {name for _, name in rows}
        drop += [(s, p.name) for s, p in bases(lake.settings).items() if s < keep and p.name not in unlisted]
    if not drop:
        return []
    for _, name in drop:
        segments.remove_file(folder / name)  # a process reading it keeps its open file until it moves on
    segments.fsync_dir(folder)

    def once() -> None:
        con = lake.con
        con.execute("BEGIN TRANSACTION")
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'index')")
        con.execute("DELETE FROM indexes WHERE snapshot IN (SELECT unnest(?))", [[s for s, _ in drop]])
        con.execute("COMMIT")

    retrying(lake.con, once, deadline_s=lake.settings.write_wait_s, what="deleting old bases")
    return [name for _, name in drop]
