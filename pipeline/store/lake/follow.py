"""One process following the lake: what
``pipeline.store.reader.Reader`` reads (docs/LAKE.md).

The process holds a **base** (a base file built by ``derive.build_base`` for
a snapshot ``B``, under ``store.index_path``, outside the lake's data path)
and merges the snapshots after it as deltas (``Snapshot.extend``). It asks
the catalog for its latest snapshot at most every ``store.poll_ms``, and at
once when a caller needs the newest state (a write) or this process
committed a snapshot it has not read yet (read-your-writes); when the
snapshot moved, it reads ``changes_since`` its own snapshot only.

Bases are found through the lake's ``indexes`` table (every process, and
every host sharing the catalog and the index path, learns of a new base
there, not by listing a folder). One is built by compaction
(``pipeline.store.lake.compaction``), by the write that finds none (the
lake's first write) or by a large write (``compact_delta_memories`` or more memories), at
that write's snapshot. Builders racing for one snapshot build apart and link
the result into place: one wins, the others' equal files are dropped.

A running process that sees a newer base (at a poll whose snapshot moved:
recording a base commits a snapshot) opens it **in the background**, its
vector index and postings too as far as the old base had them, while queries
go on from the old base extended by the changes; the next poll after the
load merges the changes since the new base over it and puts it in use.

A base's vector index and postings are memory-mapped from this host's cache
(``<data dir>/cache/<base name>/``, ``pipeline.store.hostcache``): the first
process of the host to need them writes them there, every other one maps the
same files. A process that puts a base in use deletes the cache folders of
the bases older than it that ``indexes`` no longer lists (compaction dropped
them); another process still reading one keeps its mapped pages (POSIX).

A base file listed but gone when opened (another host's compaction dropped
it, after listing a newer one) is not an error: the listing is read again
and the newer base taken.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import threading
import time
import weakref
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np

from pipeline.errors import InputError, StoreError
from pipeline.settings import Settings
from pipeline.store import files, hostcache, segments
from pipeline.store.database import utcnow
from pipeline.store.lake import erase as erasing
from pipeline.store.lake.catalog import Catalog, NoLake, attach
from pipeline.store.lake.commit import (
    lists_a_base,
    messages_since,
    only_audit,
    only_audit_since,
)
from pipeline.store.lake.derive import (
    SNAPSHOT_KEY,
    base_snapshot,
    build_base,
    build_path,
    deltas_of,
    deltas_since,
    exists,
    expired_build,
    open_view,
    record,
    sweep_builds,
)
from pipeline.store.lake.read import Cut, SnapshotGone, oldest
from pipeline.store.lake.records import Committed, LakeWrite, SnapshotWrite
from pipeline.store.lake.store import CUT_TRIES, Lake
from pipeline.store.overlay import Delta
from pipeline.store.reader import Reader, Snapshot

log = logging.getLogger("dimple.lake")

_BASE = re.compile(r"base-(\d+)\.duckdb")
_CACHED = re.compile(r"base-(\d+)")
# How many times a base file listed but gone when opened sends the follower
# back to the listing before that is an error.
_GONE_TRIES = 3
# A base that failed to load in the background is tried again after this
# pause, doubled at each failure in a row up to the cap; meanwhile the old
# base goes on answering, with ever more snapshots merged over it.
LOAD_RETRY_S = 5.0
LOAD_RETRY_MAX_S = 300.0


def index_dir(settings: Settings) -> Path:
    """Where bases built from the lake live (``store.index_path``); ``StoreError``
    naming ``store.index_path`` when it lies inside the lake's data path (whose
    clean-up deletes every file no snapshot lists)."""
    path, data_path = settings.lake_index_path, settings.lake_data_path
    if path.resolve().is_relative_to(data_path.resolve()):
        raise StoreError(f"store.index_path: {path} is inside the lake's data path {data_path} (the lake's "
                         "clean-up deletes files there that no snapshot lists): choose a folder outside it")
    return path


def cache_dir(settings: Settings) -> Path:
    """This host's cache of the bases' arrays (``pipeline.store.hostcache``):
    ``<data dir>/cache``, one folder per base file, named as its stem."""
    return settings.data_dir / "cache"


def base_file(settings: Settings, snapshot: int) -> Path:
    return index_dir(settings) / f"base-{snapshot}.duckdb"


def bases(settings: Settings) -> dict[int, Path]:
    """The base files in this host's index path, by the snapshot each holds
    (a look at the folder, without the catalog: ``require_store``'s cheap check)."""
    folder = index_dir(settings)
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): folder / m.group(0) for p in folder.iterdir() if (m := _BASE.fullmatch(p.name))}


def listed(lake: Lake) -> dict[int, Path]:
    """The bases the lake's ``indexes`` table lists whose file this host can
    read, by snapshot (several rows of one snapshot: one file)."""
    folder = index_dir(lake.settings)
    rows = lake.con.execute("SELECT DISTINCT snapshot, path FROM indexes ORDER BY snapshot").fetchall()
    return {int(snap): folder / name for snap, name in rows if (folder / name).is_file()}


# How old an ``as_of`` time must be: a commit is stamped when its catalog
# transaction starts and seen when it ends (seconds under load), and hosts'
# clocks differ; past this, the snapshot a time names no longer changes, so
# every stage of a query (each resolves it) reads the same one.
AS_OF_SETTLED = timedelta(seconds=10)


def sweep_cache(lake: Lake, settings: Settings, *, newer_than: int | None = None,
                listing: dict[int, Path] | None = None) -> list[str]:
    """Delete this host's cache folders of the bases ``indexes`` no longer
    lists (compaction dropped them: after an erase they hold erased memories'
    vectors and terms), keeping those of bases after ``newer_than`` (one being
    built and listed now); a process still reading a deleted one keeps its
    mapped pages. Run by a process putting a base in use, by the compaction
    that dropped them, and by every ingest worker's upkeep check, so a host's
    folders go within the erase bound however quiet its search processes are.
    The names deleted; never an error (the cache is this host's economy)."""
    root = cache_dir(settings)
    if not root.is_dir():
        return []
    held = set(listed(lake) if listing is None else listing)  # ``listing``: ``listed`` as the caller just read it

    def keep(name: str) -> bool:
        m = _CACHED.fullmatch(name)
        return m is None or int(m.group(1)) in held or (newer_than is not None and int(m.group(1)) >= newer_than)

    try:
        gone = hostcache.sweep(root, keep)
    except OSError as exc:
        log.warning("could not clear the host cache %s: %s", root, exc)
        return []
    if gone:
        log.info("host cache: deleted %s (bases compaction dropped)", ", ".join(gone))
    return gone


class Follower:
    """The lake side of one process's ``Reader``: its open ``Lake`` (one
    connection, used under ``lock``) and when it last asked for the latest snapshot.
    ``host_cache``: the bases' arrays are memory-mapped from this host's
    cache (``cache_dir``); False: read into this process (a benchmark's baseline)."""

    def __init__(self, settings: Settings, *, memory_limit: str | None = None, host_cache: bool = True):
        self.settings = settings
        self.memory_limit = memory_limit
        self.cache_root = cache_dir(settings) if host_cache else None
        self.lock = threading.RLock()
        self._lake: Lake | None = None
        self._attached: tuple[duckdb.DuckDBPyConnection, Catalog, Path] | None = None
        self._polled = float("-inf")
        # (view's snapshot, latest): every snapshot between them an audit commit, the view still current
        self._quiet = (0, 0)
        self._base_at = -1  # the snapshot of the base this process reads (-1: none yet)
        self._loading: threading.Thread | None = None  # a newer base being opened in the background
        self._loading_at = -1  # the snapshot of the base it opens
        self._pending: tuple[int, Snapshot] | None = None  # (its snapshot, it) once opened
        self._next: tuple[int, Path] | None = None  # a newer base listed while one loaded: opened after it
        self._next_at = 0.0  # not before then (monotonic): a load that failed is tried again after a pause
        self._load_failures = 0  # loads failed in a row (the pause doubles)
        self._own: SnapshotWrite | None = None  # the last write this process committed, as its changes read
        self._closed = False
        self._erase_checked = float("-inf")  # when erase_due last found none due
        self._oldest, self._oldest_asked = 0, float("-inf")  # the oldest snapshot held, when asked (readable)

    def lake(self, embedding_dim: int | None = None) -> Lake | None:
        """The open lake; None while it has no record tables and ``embedding_dim``
        is not given (given, a new lake is created for it)."""
        with self.lock:
            if self._lake is None:
                if self._attached is None:  # attached once: loading the extensions takes most of a second
                    index_dir(self.settings)  # refused inside the data path before anything is written
                    self._attached = attach(self.settings)
                    self._closed = False
                try:
                    self._lake = Lake.open(
                        self.settings, embedding_dim=embedding_dim, attached=self._attached,
                        embedding_model=self.settings.embedding_model if embedding_dim is not None else None)
                except NoLake:
                    return None
            elif embedding_dim is not None and embedding_dim != self._lake.info.embedding_dim:
                raise StoreError(f"the lake holds {self._lake.info.embedding_dim}-d embeddings "
                                 f"({self._lake.info.embedding_model}); the configured model gives {embedding_dim}-d")
            return self._lake

    def follow(self, current: Snapshot | None, *, fresh: bool = False) -> Snapshot | None:
        """The newest state: ``current`` itself when asked within ``store.poll_ms``
        of the last poll (unless ``fresh``, or this process committed past it),
        else ``current`` extended by the changes since, or a base loaded whole
        (no ``current``, or its snapshot expired). A newer base another process
        listed is opened in the background (``_start_loading``) and put in use
        at the first call after it is ready. None: nothing written yet."""
        now = time.monotonic()
        current_version = current.version if current is not None else 0
        if (not fresh and self._pending is None and current_version >= _COMMITTED.get(self.settings.lake_catalog, 0)
                and now - self._polled < self.settings.store.poll_ms / 1000.0):
            return current
        with self.lock:
            lake = self.lake()
            self._polled = now
            if lake is None:
                return None
            latest = lake.latest_snapshot()
            if self._pending is None and current is not None:
                self._load_next(current)  # the load before it failed
            if self._pending is not None and current is not None:
                swapped = self._swap(lake, latest)
                if swapped is not None:
                    self._load_next(swapped)
                    return swapped
            if current is not None and (current.version == latest or self._quiet == (current.version, latest)):
                return current  # recording a base commits a snapshot: none is new
            own = self._own
            if own is not None and current is not None and current.store is not None and \
                    own.snapshot == latest == current.version + 1:
                # the one new snapshot is this process's own write: the view is extended by
                # the write itself, as ``changes_since`` would read it back (``own_write``)
                return current.extend(latest, deltas_of([own], current.router(), self.settings,
                                                        lake.info.embedding_dim))
            if current is not None and current.store is not None:
                messages = messages_since(lake.con, current.version, latest)  # one question for both uses
                if only_audit(messages):
                    # audit rows only (every query's row commits one on this engine):
                    # the view stands, no changes read, no overlay rebuilt
                    self._quiet = (current.version, latest)
                    return current
                try:
                    changes = lake.changes_since(current.version, latest)
                except Cut as cut:
                    if not cut.expired:  # a compaction moved files as they were read: the next poll reads them
                        self._polled = 0.0
                        return current
                except StoreError:
                    pass  # expired (an erase, or past store.retain): load a base whole
                else:
                    deltas = deltas_since(changes, current.router(), self.settings, lake.info.embedding_dim)
                    # a snapshot listing a base writes no record: `indexes` (a lake read) is read
                    # only when a new snapshot without records may have listed one (its commit message)
                    if not set(range(current.version + 1, latest + 1)) <= set(deltas) and lists_a_base(messages):
                        held = listed(lake)
                        newest = max((b for b in held if b <= latest), default=None)
                        if newest is not None and newest > self._base_at:
                            self._start_loading(newest, held[newest], current)
                    return current.extend(latest, deltas)
            return self._load(lake, latest)

    def _start_loading(self, snapshot: int, path: Path, current: Snapshot) -> None:
        """Open the base ``path`` (of ``snapshot``) in a thread of its own, with
        the indexes ``current`` has loaded, while ``current`` goes on answering."""
        if self._loading is not None and (self._loading.is_alive() or self._loading_at >= snapshot):
            if self._loading.is_alive() and snapshot > self._loading_at:
                self._next, self._next_at = (snapshot, path), 0.0  # its listing is read once: kept until this load is done
            return
        assert current._uses is not None
        index_wanted, postings_wanted = current._index is not None, current._uses.postings_loaded
        memory_limit, cache = self.memory_limit, self._cache(path)

        def run() -> None:
            try:
                snap = Snapshot.open(path, 0, base=str(path), memory_limit=memory_limit, cache=cache)
                try:
                    assert snap.store is not None
                    if base_snapshot(snap.store) != snapshot:
                        raise StoreError(f"{path} does not hold snapshot {snapshot} (its {SNAPSHOT_KEY})")
                    if index_wanted:
                        snap.index()
                    if postings_wanted:
                        snap.postings()
                except BaseException:
                    snap.close()
                    raise
            except BaseException as exc:  # noqa: BLE001 - the old base goes on; this one is tried again
                with self.lock:
                    self._load_failures += 1
                    pause = min(LOAD_RETRY_MAX_S, LOAD_RETRY_S * 2 ** (self._load_failures - 1))
                    if self._next is None or self._next[0] < snapshot:  # (a newer one listed meanwhile goes first)
                        self._next, self._next_at = (snapshot, path), time.monotonic() + pause
                    if self._loading_at == snapshot:
                        self._loading_at = self._base_at
                log.warning("could not load the lake's base of snapshot %s (%s): %s; tried again in %.0f s",
                            snapshot, path, exc, pause)
                return
            with self.lock:
                self._load_failures = 0
                if self._closed:
                    snap.close()
                    return
                if self._pending is not None:
                    self._pending[1].close()
                self._pending = (snapshot, snap)

        self._loading_at = snapshot
        self._loading = threading.Thread(target=run, name="dimple-lake-base-load", daemon=True)
        _LOADING.add(self._loading)
        self._loading.start()

    def newest_base(self) -> int:
        """The snapshot of the newest base this process knows is listed: the one
        it reads, or a newer one it is loading, has loaded or loads next (-1: none)."""
        pending, after = self._pending, self._next
        return max(self._base_at, self._loading_at, pending[0] if pending is not None else -1,
                   after[0] if after is not None else -1)

    def _load_next(self, current: Snapshot) -> None:
        """Open the base listed while another was loading, once that load is done, or one whose load
        failed, once its pause is over."""
        after = self._next
        if after is None or (self._loading is not None and self._loading.is_alive()) or time.monotonic() < self._next_at:
            return
        self._next = None
        if after[0] > self._base_at:
            self._start_loading(after[0], after[1], current)

    def _swap(self, lake: Lake, latest: int) -> Snapshot | None:
        """The background-loaded base with the changes since it merged (None: it
        cannot be used, its snapshot expired meanwhile)."""
        assert self._pending is not None
        snapshot, snap = self._pending
        self._pending = None
        if snapshot <= self._base_at:
            snap.close()
            return None
        try:
            changes = lake.changes_since(snapshot, latest)
            view = snap.extend(latest, deltas_since(changes, snap.router(), self.settings, lake.info.embedding_dim))
        except BaseException:
            snap.close()
            return None
        self._in_use(lake, snapshot)
        return view

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait for a base loading in the background (the next ``follow`` puts it in use)."""
        thread = self._loading
        if thread is not None:
            thread.join(timeout)

    def _load(self, lake: Lake, latest: int, *, cuts: int = 0) -> Snapshot | None:
        """The newest listed base with the snapshots up to ``latest`` merged
        (a base built at ``latest`` when none is listed or its snapshot
        expired); None while nothing is remembered. An erase that expires
        ``latest`` during the build (``Cut``) listed a base of its own: loaded
        instead."""
        held: dict[int, Path] = {}
        listing: dict[int, Path] = {}
        for _ in range(_GONE_TRIES):
            listing = listed(lake)
            held = {b: p for b, p in listing.items() if b <= latest}
            if not held:
                break
            snapshot = max(held)
            try:
                view = self._open(lake, held[snapshot], latest)
            except (StoreError, FileNotFoundError):
                if held[snapshot].exists():
                    break  # its snapshot expired from the lake: build one at the latest
                latest = max(latest, lake.latest_snapshot())  # gone since listed: the newer base is listed
                continue
            self._in_use(lake, snapshot, listing)
            return view
        else:
            raise _gone(self.settings)
        try:
            if not held and lake.count(at=latest) == 0:
                return None  # nothing remembered yet
            view = self._open(lake, self.build(latest), latest)
        except Cut:
            if cuts + 1 >= CUT_TRIES:
                raise
            return self._load(lake, lake.latest_snapshot(), cuts=cuts + 1)
        self._in_use(lake, latest, listing)
        return view

    def _open(self, lake: Lake, base: Path, until: int) -> Snapshot:
        """The base ``base`` with the snapshots up to ``until`` merged, read again
        when a compaction moved the lake's files as they were read (a ``Cut``
        whose snapshot has not expired, as ``follow`` reads at its next poll):
        not taken for an expired snapshot, which builds a whole base instead."""
        for attempt in range(1, CUT_TRIES + 1):
            try:
                return open_view(lake, base, self.settings, until=until, memory_limit=self.memory_limit,
                                 cache=self._cache(base))
            except Cut as cut:
                if cut.expired or attempt == CUT_TRIES:
                    raise
        raise AssertionError("unreachable")

    def _cache(self, base: Path) -> Path | None:
        """The folder of the base file ``base`` in this host's cache (None: no cache)."""
        return self.cache_root / base.stem if self.cache_root is not None else None

    def _in_use(self, lake: Lake, snapshot: int, listing: dict[int, Path] | None = None) -> None:
        """The base of ``snapshot`` is the one this process reads: the host
        cache's folders of older bases that ``indexes`` no longer lists are
        deleted (a process still reading one keeps its mapped pages).
        ``listing``: ``listed`` as just read (a base listed since is newer, kept anyway)."""
        self._base_at, self._load_failures = snapshot, 0
        sweep_cache(lake, self.settings, newer_than=snapshot, listing=listing)

    def clear_cache(self) -> list[str]:
        """``sweep_cache`` for this process (the upkeep check's, once a minute):
        the folders of bases no longer listed, this process's own kept; and
        the partial bases of snapshots the lake no longer holds (``sweep_builds``:
        a builder that read one before an erase expired it, killed after the
        erase's own sweep, left one that may hold an erased memory)."""
        with self.lock:
            lake = self.lake()
            if lake is None:
                return []
            sweep_builds(index_dir(self.settings), expired_before=oldest(lake.con))
            return sweep_cache(lake, self.settings, newer_than=self._base_at if self._base_at >= 0 else None)

    def view_at(self, snapshot: int) -> Snapshot:
        """The store as it was at ``snapshot`` (``as_of``), memories forgotten
        since left out: the newest base at or before it plus the snapshots up to
        it (``open_view(until=snapshot)``), else a base built at it (a whole
        build: seconds per 100k memories, listed in ``indexes`` for the next),
        then the forgets committed after it as one delta."""
        with self.lock:
            lake = self.lake()
            latest = lake.latest_snapshot() if lake is not None else 0
            if lake is None or not 0 < snapshot <= latest:
                raise InputError("as_of", f"no snapshot {snapshot} in the lake (its latest is {latest})")
            self._oldest_asked = float("-inf")
            if not self.readable(snapshot):
                raise InputError("as_of", f"snapshot {snapshot} can no longer be read: the lake's oldest is "
                                          f"{self._oldest} (store.retain, or an erase since)")
            dim = lake.info.embedding_dim
            for _ in range(_GONE_TRIES):
                held = {b: p for b, p in listed(lake).items() if b <= snapshot}
                base = held[max(held)] if held else None
                try:
                    view = self._open(lake, base if base is not None else self.build(snapshot), snapshot)
                except (StoreError, FileNotFoundError) as exc:
                    if base is not None and not base.exists():
                        continue  # dropped since listed (another host's compaction): the listing again
                    raise InputError("as_of", f"snapshot {snapshot} can no longer be read: {exc}") from None
                break
            else:
                raise _gone(self.settings)
            try:
                forgotten = sorted({i for done in lake.changes_since(snapshot, latest).writes(dim)
                                    for i in done.forgotten})
            except StoreError as exc:
                view.close()
                raise InputError("as_of", f"snapshot {snapshot} can no longer be read: {exc}") from None
            if not forgotten:
                return view
            empty = np.zeros((0, dim), np.float32)
            return view.extend(snapshot, {latest + 1: Delta(seq=latest + 1, memories=[], vectors=empty,
                                                            forget=forgotten)})

    def latest(self) -> int:
        """The lake's latest snapshot, asked now (0: nothing written yet)."""
        with self.lock:
            lake = self.lake()
            return lake.latest_snapshot() if lake is not None else 0

    def unchanged_since(self, version: int) -> bool:
        """Whether the store is as it was at ``version``: no snapshot since, or
        only audit commits (an ``as_of`` view built then still holds)."""
        with self.lock:
            lake = self.lake()
            if lake is None:
                return version == 0
            latest = lake.latest_snapshot()
            return latest == version or only_audit_since(lake.con, version, latest)

    def reached(self, version: int) -> int:
        """The newest snapshot a view of ``version`` answers for: the latest
        seen when every snapshot since ``version`` was an audit commit, else
        ``version`` (``Reader.at_least``: a ``min_version`` naming an audit
        commit is reached without a change to read)."""
        quiet_from, quiet_to = self._quiet
        return quiet_to if quiet_from == version else version

    def snapshot_for(self, at: datetime) -> int:
        """The snapshot ``as_of`` a time stands for: the last one committed at
        or before ``at`` (UTC when it names no zone). A time still to come is
        refused, and so is one within ``AS_OF_SETTLED`` of now: a commit
        before it could still change the answer between one stage of a query
        and the next; a settled time's snapshot never changes."""
        when = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
        now = datetime.now(UTC)
        if when > now:
            raise InputError("as_of", f"{when.isoformat()} is in the future")
        if when > now - AS_OF_SETTLED:
            raise InputError("as_of", f"{when.isoformat()} is less than {AS_OF_SETTLED.total_seconds():g} s ago: a "
                                      "commit stamped before it may still be on its way (another host's clock, a "
                                      "slow catalog); for the last seconds give a snapshot (a write's version)")
        with self.lock:
            lake = self.lake()
            if lake is None:
                raise InputError("as_of", "no snapshot in the lake yet")
            return lake.snapshot_at(when)

    def build(self, snapshot: int) -> Path:
        """A base file for ``snapshot`` (built unless one exists), listed in the lake's ``indexes``."""
        return self.build_listed(snapshot)[0]

    def build_after_write(self, snapshot: int, write_id: str | None = None) -> tuple[Path | None, int]:
        """``build_listed`` for what was just written at ``snapshot`` (a write,
        a migrate, a reembed): when an erase expired the snapshot meanwhile
        (``Cut(expired)``), no base, and the snapshot that had listed it (as a
        replay of the write answers), else ``snapshot``: what was written
        stands, read through the erase's base."""
        try:
            return self.build_listed(snapshot, write_id)
        except Cut as cut:
            if not cut.expired:
                raise
            return None, cut.listing or snapshot

    def build_listed(self, snapshot: int, write_id: str | None = None) -> tuple[Path, int]:
        """``build``, and the snapshot that lists the base (this process's next read reaches it)."""
        target = base_file(self.settings, snapshot)
        with self.lock:
            lake = self.lake()
            if lake is None:
                raise StoreError("the lake has no record tables: nothing to build a base from")
            if not target.exists():
                work = build_path(target)
                files.remove_file(work)
                try:
                    build_base(lake, snapshot, work, self.settings)
                    try:
                        os.link(work, target)  # never over another builder's file: a reader may have it open
                    except FileExistsError:
                        pass
                except (OSError, duckdb.Error, SnapshotGone) as exc:  # an erase expired the snapshot (and its builds)
                    if exists(lake, snapshot):
                        raise
                    raise expired_build(snapshot) from exc
                finally:
                    files.remove_file(work)
                files.fsync_dir(target.parent)
            listing = record(lake, snapshot, target, write_id)
            committed(self.settings, listing)
        return target, listing

    def readable(self, snapshot: int) -> bool:
        """Whether the lake still holds ``snapshot`` (an erase or ``store.retain``
        expires old ones): the oldest it holds, asked at most every ``store.poll_ms``."""
        now = time.monotonic()
        if now - self._oldest_asked >= self.settings.store.poll_ms / 1000.0:
            with self.lock:
                lake = self.lake()
                if lake is None:
                    return False
                self._oldest = oldest(lake.con)
                self._oldest_asked = now
        return snapshot >= self._oldest

    def erase_due(self, *, fresh: bool = False) -> bool:
        """Whether a forget waits to be erased by a compaction (``erase.due``).
        Asked of the catalog at most every ``erase.check_every`` while the
        answer is no (one small read a minute), at every call while it is yes
        or when ``fresh`` (the periodic check, which keeps its own pace)."""
        now = time.monotonic()
        wait = erasing.check_every(self.settings.store.erase_within).total_seconds()
        if not fresh and now < self._erase_checked + wait:
            return False
        with self.lock:
            lake = self.lake()
            if lake is None:
                return False
            due = erasing.erase_due(lake.con, self.settings.store.erase_within, utcnow())
        self._erase_checked = float("-inf") if due else now
        return due

    def erase_state(self) -> erasing.EraseState | None:
        """The forgets waiting to be erased and any wait of the erase (``erase.erase_state``); None: no lake yet."""
        with self.lock:
            lake = self.lake()
            return None if lake is None else erasing.erase_state(lake.con)

    def written(self, write_id: str) -> int | None:
        """The snapshot of the write ``write_id`` when the lake holds it (a redelivered message), else None."""
        with self.lock:
            lake = self.lake()
            return None if lake is None else lake.written(write_id)

    def commit(self, write: LakeWrite, embedding_dim: int | None) -> Committed:
        """``write`` as one catalog transaction; this process's next read reaches its snapshot."""
        with self.lock:
            lake = self.lake(embedding_dim)
            if lake is None:
                raise StoreError("the lake has no record tables and the write carries no embeddings to create them")
            done = lake.commit(write)
            committed(self.settings, done.snapshot)
            self._own = None if done.replayed else own_write(write, done.snapshot)
            return done

    def close(self) -> None:
        self.wait_ready()  # DuckDB aborts a process that exits inside a query: the load ends first
        with self.lock:
            self._closed = True
            if self._pending is not None:
                self._pending[1].close()
                self._pending = None
            if self._lake is not None:
                self._lake.close()
            elif self._attached is not None:
                self._attached[0].close()
            self._lake = self._attached = None


# The newest snapshot each lake (by its catalog) got from a commit of this
# process, through whichever Follower: every reader of that lake in the
# process reaches it at its next read (a CLI's write through a reader of its
# own, then queries through the process's: ``dimple eval`` updating its store).
_COMMITTED: dict[str, int] = {}
_COMMITTED_LOCK = threading.Lock()


def committed(settings: Settings, snapshot: int) -> None:
    """This process committed ``snapshot`` to the lake ``settings`` name: its readers' next reads reach it."""
    with _COMMITTED_LOCK:
        _COMMITTED[settings.lake_catalog] = max(_COMMITTED.get(settings.lake_catalog, 0), snapshot)


def own_write(write: LakeWrite, snapshot: int) -> SnapshotWrite | None:
    """What ``Changes.writes`` reads back of ``write``, committed as ``snapshot``,
    without reading it: the memories it remembered, sorted by id, with their
    topics, concepts and edges sorted and their metadata through JSON as the
    lake keeps it (``LakeMemory.metadata_json``). A replacement's deleted
    rows are its own memories' (it forgets none). None for a write that
    forgets: which edges of other memories it cut is known only to the lake."""
    if write.forget or not write.remember:
        return None
    remembered = [replace(m, topics=sorted(m.topics), concepts=sorted(m.concepts), edges=sorted(m.edges),
                          metadata=None if m.metadata_json is None else json.loads(m.metadata_json))
                  for m in sorted(write.remember, key=lambda m: m.id)]
    return SnapshotWrite(snapshot, remembered)


def _gone(settings: Settings) -> StoreError:
    return StoreError(f"store.index_path: the base files the lake's indexes list in {index_dir(settings)} were "
                      f"gone each of {_GONE_TRIES} times this process opened one (dropped as listed): is that folder "
                      "the one every host and compaction uses?")


# DuckDB aborts the process when it exits while a thread is inside a query:
# a base still loading in the background is waited for at exit (as in pipeline.store.reader).
_LOADING: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


@atexit.register
def _join_loading() -> None:
    for thread in list(_LOADING):
        thread.join()


def reader_for(settings: Settings, *, memory_limit: str | None = None) -> Reader:
    """The ``Reader`` of the lake ``settings`` name. A data dir holding a
    segment store not yet migrated is refused (``segments.refuse_unmigrated``)."""
    segments.refuse_unmigrated(settings.data_dir)
    return Reader(settings.data_dir, memory_limit=memory_limit, lake=Follower(settings, memory_limit=memory_limit))
