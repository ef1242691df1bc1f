"""Compaction of the lake (docs/LAKE.md, "Derived
indexes" and "Forget means erased"): what ``compact()`` and ``dimple compact``
do on the lake, and what a write that makes one due sends (``ingest.compact``).

One at a time across processes and hosts: a compaction claims the one row of
``compaction_head`` in a transaction of its own (two claims at once both
update it: the catalog commits one, the other finds it held) and gives it
back when done. A running compaction renews its claim every ``HEARTBEAT``; a
claim not renewed for ``LEASE`` (its compaction died), or held by a process
of this host that is gone, is taken over, and the dead one recorded in
``dead_compactions``: files it wrote and never committed may hold bytes an
erase must remove (``erase.cut`` waits for them). Holding it, a compaction

1. moves inlined rows to Parquet and merges small files
   (``ducklake_flush_inlined_data``, ``ducklake_merge_adjacent_files``);
2. when an erase is due (``erase.due``: a forget not erased for most of
   ``store.erase_within``), rewrites the files without deleted rows
   (``erase.rewrite``); otherwise expires the snapshots older than
   ``store.retain`` (``erase.expire``);
3. builds a base at the latest snapshot (``derive.build_base``, into
   ``store.index_path``) and lists it in ``indexes``, where every process
   finds it and loads it in the background (``follow``);
4. after a rewrite, cuts the history (``erase.cut``): every snapshot before
   the base's expired, the files only they read deleted, the catalog
   vacuumed;
5. deletes the bases no one needs any more, file and row: after an erase all
   but the new one (they may hold an erased memory), else those whose
   snapshot has expired (no reader can bring them up to date).

The base is listed before the history is cut, at a snapshot the cut keeps: a
reader whose base expires finds the new one and loads it, instead of building
a whole base in the foreground.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from datetime import timedelta

import duckdb

from pipeline.errors import StoreError
from pipeline.processes import gone
from pipeline.settings import Settings
from pipeline.store import files
from pipeline.store.compact import CompactReport
from pipeline.store.database import utcnow
from pipeline.store.lake import erase as erasing
from pipeline.store.lake.catalog import LAKE, extensions_dir, one
from pipeline.store.lake.commit import retrying
from pipeline.store.lake.derive import sweep_builds, unlist
from pipeline.store.lake.follow import Follower, bases, index_dir, listed, sweep_cache
from pipeline.store.lake.read import oldest
from pipeline.store.lake.store import Lake

log = logging.getLogger("dimple.lake")

# A claim of compaction_head this old is a compaction that died on another
# host: another may take over. A running compaction renews its claim every
# HEARTBEAT (``_Heartbeat``), so the lease only has to outlast a few missed
# renewals (a catalog slow under load), not a whole compaction; a claim of
# this host whose process is gone is taken over at once (``_dead_here``).
# Two compactions at once would still be correct, only wasteful (each step is
# its own retried transaction).
LEASE = timedelta(minutes=3)
HEARTBEAT = timedelta(seconds=30)


def holder_name() -> str:
    """Who claims ``compaction_head``: ``host:pid:nonce``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _dead_here(holder: str) -> bool:
    """Whether ``holder`` (``host:pid:nonce``) is a compaction of this host whose
    process is gone (killed midway): its claim need not wait for ``LEASE``. A
    pid used again by another process reads as alive: the lease decides then."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    return gone(int(pid_text))


def claim(lake: Lake, holder: str) -> bool:
    """Claim ``compaction_head`` for ``holder``: False when another compaction holds it
    (a claim renewed within ``LEASE`` by a process that is not known to be dead)."""
    def once() -> bool:
        con = lake.con
        now = utcnow()
        con.execute("BEGIN TRANSACTION")
        held_by, at = one(con.execute("SELECT holder, claimed_at FROM compaction_head")) or (None, None)
        if held_by is not None and at is not None and at >= now - LEASE and not _dead_here(held_by):
            con.execute("ROLLBACK")
            return False
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'compaction')")
        con.execute("UPDATE compaction_head SET seq = seq + 1, holder = ?, claimed_at = ?", [holder, now])
        if held_by is not None:  # files it wrote and never committed may hold what an erase removes
            con.execute("INSERT INTO dead_compactions VALUES (?, ?, false)", [held_by, now])
        con.execute("COMMIT")
        if held_by is not None:
            log.warning("compaction: took over the claim of %s (claimed at %s): it died midway", held_by, at)
        return True

    return retrying(lake.con, once, deadline_s=lake.settings.write_wait_s, what="claiming the compaction")[0]


class _Heartbeat:
    """While a compaction runs, its claim's ``claimed_at`` renewed every
    ``HEARTBEAT`` from a thread of its own, on a cursor of its own (the
    compaction holds the lake's connection throughout)."""

    def __init__(self, lake: Lake, holder: str):
        self.cur = lake.con.cursor()
        self.cur.execute(f"USE {LAKE}")
        self.holder, self.deadline_s = holder, lake.settings.write_wait_s
        self.stop = threading.Event()
        self.lost = threading.Event()  # a renewal found the claim taken over
        self.thread = threading.Thread(target=self._run, name="dimple-compaction-heartbeat", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()  # DuckDB aborts a process that exits inside a query: the renewal ends first
        self.cur.close()

    def _run(self) -> None:
        while not self.stop.wait(HEARTBEAT.total_seconds()):
            try:
                if not self.renew():
                    self.lost.set()
                    log.warning("compaction: the claim of %s was taken over (not renewed for %s)", self.holder, LEASE)
            except Exception:  # noqa: BLE001 - the next beat tries again; the lease covers a few misses
                log.exception("compaction: could not renew the claim of %s", self.holder)

    def holding(self, step: str) -> None:
        """Raise ``StoreError`` before ``step`` once the claim was taken over: its
        taker recorded this compaction dead at that moment (``dead_compactions``),
        and files written after it would escape an erase's wait if this one died."""
        if self.lost.is_set():
            raise StoreError(f"compaction: its claim ({self.holder}) was taken over, not renewed for {LEASE}; "
                             f"stopped before {step}")

    def renew(self) -> bool:
        cur = self.cur

        def once() -> bool:
            cur.execute("BEGIN TRANSACTION")
            cur.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'compaction')")
            row = one(cur.execute("UPDATE compaction_head SET claimed_at = ? WHERE holder = ?",
                              [utcnow(), self.holder]))
            cur.execute("COMMIT")
            return bool(row and row[0])

        return retrying(cur, once, deadline_s=self.deadline_s, what="renewing the compaction's claim")[0]


def release(lake: Lake, holder: str) -> None:
    """Give ``compaction_head`` back (if ``holder`` still holds it)."""
    def once() -> None:
        con = lake.con
        con.execute("BEGIN TRANSACTION")
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'compaction')")
        con.execute("UPDATE compaction_head SET holder = NULL, claimed_at = NULL WHERE holder = ?", [holder])
        con.execute("COMMIT")

    retrying(lake.con, once, deadline_s=lake.settings.write_wait_s, what="ending the compaction")


def _changed_since(lake: Lake, snapshot: int) -> bool:
    """Whether a write committed after ``snapshot`` (True when it has expired)."""
    try:
        row = one(lake.con.execute("SELECT (SELECT count(*) FROM writes) - (SELECT count(*) FROM writes "
                               "AT (VERSION => ?))", [snapshot]))
    except duckdb.Error:
        return True
    return bool(row and row[0])


def compact_lake(settings: Settings, *, wait: bool = False, rebuild: bool = False, erase: bool = False,
                 follower: Follower | None = None) -> CompactReport:
    """Compact the lake ``settings`` name (the module's steps). Without ``wait``
    it returns at once (``ran`` False) when another compaction holds the
    claim; with it, it waits up to ``write_wait_s`` for that one to end. With
    nothing written since the newest base and no erase due it only deletes
    bases no one needs (``ran`` False), unless ``rebuild`` (a base is built
    whole from the records either way: ``rebuild`` only forces one).
    ``erase``: every forget waiting is erased now, due or not (an erase of
    forgets due runs either way)."""
    t0 = time.perf_counter()
    own = follower is None
    follower = follower or Follower(settings)
    try:
        lake = follower.lake()
        if lake is None:
            return CompactReport(ran=False)  # nothing written yet
        holder = holder_name()
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
            with follower.lock, _Heartbeat(lake, holder) as beat:
                report = _compact(lake, follower, settings, rebuild, beat, erase_now=erase)
        finally:
            with follower.lock:
                release(lake, holder)
        report.seconds = time.perf_counter() - t0
        return report
    finally:
        if own:
            follower.close()


def _compact(lake: Lake, follower: Follower, settings: Settings, rebuild: bool, beat: _Heartbeat, *,
             erase_now: bool = False) -> CompactReport:
    deadline = settings.write_wait_s
    held = listed(lake)
    newest = max(held, default=None)
    state = erasing.erase_state(lake.con)
    # asked for (``erase_now``): whatever the forgets' age (a held erase holds again if the dead's files remain)
    erase = state.waiting > 0 if erase_now else \
        erasing.due(state.oldest, settings.store.erase_within, utcnow(), state.held_until)
    if newest is not None and not erase and not rebuild and not _changed_since(lake, newest):
        removed = _drop_bases(lake, keep=newest, everything_older=False)
        return CompactReport(version=lake.latest_snapshot(), base=held[newest].name, removed=removed, ran=False)
    forgotten = state.waiting if erase else 0

    def step(sql: str) -> int:
        return retrying(lake.con, lambda: len(lake.con.execute(sql).fetchall()), deadline_s=deadline,
                        what="compaction")[0]

    beat.holding("its maintenance calls")
    if erase:  # the files rewritten without deleted rows (flushed and merged too); history not cut yet
        erasing.check_the_dead(lake.con, deadline_s=deadline)  # files the dead left still there: fails first
        rewritten = erasing.rewrite(lake.con, deadline_s=deadline)
    else:
        step(f"SELECT * FROM ducklake_flush_inlined_data('{LAKE}')")
        step(f"SELECT * FROM ducklake_merge_adjacent_files('{LAKE}')")
        lake.expire()
    snapshot = lake.latest_snapshot()
    path = follower.build(snapshot)
    waits = cutting = None
    if erase:
        # history cut only now that the new base is listed: a reader whose base
        # snapshot expires finds this one in `indexes` and loads it (never builds)
        beat.holding("the erase's cut")
        cutting = erasing.cut(lake.con, lake.catalog, extensions_dir(settings), rewritten=rewritten, keep=snapshot,
                              deadline_s=deadline, mark=False)
        waits = cutting.held_until
    removed = _drop_bases(lake, keep=snapshot, everything_older=erase)
    # what builders killed midway left (a base's size each), and every build of a snapshot expired (an erase's)
    sweep_builds(index_dir(settings), expired_before=oldest(lake.con))
    if cutting is not None:  # marked erased last: the older bases (and their cache) held the memories too
        erasing.mark_erased(lake.con, cutting, deadline_s=deadline)
    return CompactReport(version=lake.latest_snapshot(), base=path.name, memories=lake.count(at=snapshot),
                         forgotten=0 if waits else forgotten, removed=removed,
                         erase_held_until=waits.isoformat(timespec="seconds") if waits else None)


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
        files.remove_file(folder / name)  # a process reading it keeps its open file until it moves on
    files.fsync_dir(folder)
    unlist(lake, [s for s, _ in drop], "deleting old bases")
    sweep_cache(lake, lake.settings, newer_than=keep)  # this host's cache of them (other hosts: their upkeep)
    return [name for _, name in drop]
