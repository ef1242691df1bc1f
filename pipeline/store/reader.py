"""What one process reads: the published base, its vector index and the
deltas over it, kept current by reading ``MANIFEST`` (a small file) before
each task.

- A write publishes a delta: only that delta is read (a few kilobytes per
  memory) and the overlay rebuilt; the base stays open.
- A compaction publishes a new base: it is opened and indexed (its vector
  index and full-text postings, as far as the old base had them) in a
  background thread while queries keep being answered from the old base
  plus every delta (the old ones it holds in memory, the new ones it loads),
  which is the same store; then the new base takes over. No query waits for
  an index load, except the first one of a process.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from pipeline.errors import StoreError, VersionNotReachedError
from pipeline.store import segments
from pipeline.store.database import Store, created_at_of
from pipeline.store.fulltext import Postings, fulltext_totals, index_exists
from pipeline.store.graph import BaseGraph
from pipeline.store.hostcache import HostCache
from pipeline.store.overlay import Delta, Overlay
from pipeline.store.vector import TreeRouter, VectorIndex


class Source(Protocol):
    """Where a ``Reader`` learns of new state other than ``MANIFEST``: the
    lake (``pipeline.store.lake.follow.Follower``)."""

    def follow(self, current: Snapshot | None, *, fresh: bool = False) -> Snapshot | None: ...

    def view_at(self, snapshot: int) -> Snapshot: ...

    def snapshot_for(self, at: datetime) -> int: ...

    def reached(self, version: int) -> int: ...

    def latest(self) -> int: ...

    def unchanged_since(self, version: int) -> bool: ...

    def readable(self, snapshot: int) -> bool: ...

    def wait_ready(self, timeout: float | None = None) -> None: ...

    def close(self) -> None: ...


class _Uses:
    """Who reads one base connection: it is closed when the base is retired
    (a newer one took over) and the last stage reading it is done, never under
    a query in flight on another thread."""

    def __init__(self, store: Store | None, cache: HostCache | None = None):
        self.store = store
        self.cache = cache  # where this host keeps the base's arrays (None: each process reads its own)
        self.users = 0
        self.retired = False
        self.lock = threading.Lock()
        # read once per base: its full-text totals, and the writer's tree router
        self.totals = fulltext_totals(store.con) if store is not None else None
        self._router: TreeRouter | None = None
        self.terms: dict[str, tuple[int, int] | None] = {}  # Overlay.base_terms
        self.graph = BaseGraph()  # what search.augment read of this base, kept for the next queries
        self._postings: Postings | None = None
        self._postings_read = False
        self._postings_lock = threading.Lock()

    def postings(self) -> Postings | None:
        """The base's full-text postings in memory, read on first use (None
        without a base or a full-text index)."""
        with self._postings_lock:  # not self.lock: a load takes seconds at 1M memories
            if not self._postings_read:
                if self.store is not None:
                    cur = self.store.cursor()
                    try:
                        if not index_exists(cur):
                            self._postings = None
                        else:
                            self._postings = self.cache.postings(cur) if self.cache is not None else Postings.load(cur)
                    finally:
                        cur.close()
                self._postings_read = True
            return self._postings

    def router(self) -> TreeRouter | None:
        """The base tree's router for new memories, read on first use (None without a base)."""
        if self._router is None and self.store is not None:  # writes are serialised: no lock
            self._router = TreeRouter.load(self.store.con)
        return self._router

    @property
    def postings_loaded(self) -> bool:
        return self._postings_read

    def enter(self) -> None:
        with self.lock:
            self.users += 1

    def leave(self) -> None:
        with self.lock:
            self.users -= 1
            done = self.retired and self.users == 0
        if done:
            self._close()

    def retire(self) -> None:
        with self.lock:
            self.retired = True
            done = self.users == 0
        if done:
            self._close()

    def _close(self) -> None:
        if self.store is not None:
            self.store.close()


@dataclass
class Snapshot:
    """A base (read-only), the deltas over it, and the manifest version they make."""

    version: int
    base: str | None
    store: Store | None
    overlay: Overlay
    deltas: dict[int, Delta]  # by seq, the deltas the overlay merged
    _index: VectorIndex | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _uses: _Uses | None = None  # shared by the snapshots of one base

    def __post_init__(self) -> None:
        if self._uses is None:
            self._uses = _Uses(self.store)

    @classmethod
    def open(cls, path: Path | None, version: int, *, base: str | None = None,
             memory_limit: str | None = None, cache: Path | None = None) -> Snapshot:
        """The base file at ``path`` (None: no base), read-only, with nothing
        over it yet (``extend`` merges deltas), as state ``version``; ``base``
        is its name as the store's state names it. ``cache``: the base's folder
        in the host cache (``pipeline.store.hostcache``), where its vector
        index and postings are memory-mapped from (None: read into this process)."""
        store = None
        if path is not None:
            store = Store.open(path, read_only=True)
            if memory_limit:
                # DuckDB would otherwise keep the blocks the index load read
                # (1.5 GB at 1M memories) cached beside the numpy copy
                store.con.execute("SET memory_limit = ?", [memory_limit])
        try:
            uses = _Uses(store, HostCache(cache, path) if cache is not None and path is not None else None)
            overlay = Overlay.build(version, [], store.con if store is not None else None, _dim(store), uses.totals,
                                    uses.terms)
            return cls(version=version, base=base, store=store, overlay=overlay, deltas={}, _uses=uses)
        except BaseException:
            if store is not None:
                store.close()
            raise

    def extend(self, version: int, deltas: dict[int, Delta]) -> Snapshot:
        """This base with ``deltas`` (by seq) merged over it besides those it
        holds, as state ``version``; the base, its indexes and router are shared."""
        merged = {**self.deltas, **deltas}
        assert self._uses is not None
        overlay = Overlay.build(version, [merged[s] for s in sorted(merged)],
                                self.store.con if self.store is not None else None, _dim(self.store),
                                self._uses.totals, self._uses.terms)
        return Snapshot(version=version, base=self.base, store=self.store, overlay=overlay, deltas=merged,
                        _index=self._index, _uses=self._uses)

    def index(self) -> VectorIndex | None:
        """The base's vector index, loaded on first use (None without a base)."""
        with self._lock:
            if self._index is None and self.store is not None:
                assert self._uses is not None
                cache, dim = self._uses.cache, self.store.info.embedding_dim
                self._index = (cache.vector_index(self.store.con, self.version, dim) if cache is not None
                               else VectorIndex.load(self.store.con, self.version, dim))
            return self._index

    def postings(self) -> Postings | None:
        """The base's full-text postings in memory (``pipeline.store.fulltext.postings``), read on first use."""
        assert self._uses is not None
        return self._uses.postings()

    def router(self) -> TreeRouter | None:
        """The base tree's router for a write's new memories (``pipeline.store.vector.TreeRouter``)."""
        assert self._uses is not None
        return self._uses.router()

    def close(self) -> None:
        """Retire this snapshot's base: closed once no stage reads it any more."""
        assert self._uses is not None
        self._uses.retire()

    def namespaces(self) -> list[str]:
        """Every namespace holding a memory, in the base or a delta, sorted."""
        held = set(self.store.namespaces()) if self.store is not None else set()
        return sorted(held | {m.namespace for m in self.overlay.members.values()})

    @contextmanager
    def view(self) -> Iterator[View]:
        """This snapshot for one stage of one thread: a cursor on its base (None
        without one), its deltas and its vector index, all of the same state."""
        assert self._uses is not None
        self._uses.enter()
        try:
            cur = self.store.cursor() if self.store is not None else None
            try:
                yield View(cursor=cur, overlay=self.overlay, index=self.index, postings=self.postings,
                           model=self.store.info.embedding_model if self.store is not None else None,
                           graph=self._uses.graph)
            finally:
                if cur is not None:
                    cur.close()
        finally:
            self._uses.leave()


@dataclass
class View:
    """One snapshot as one stage of one thread reads it."""

    cursor: Any
    overlay: Overlay
    index: Callable[[], VectorIndex | None]
    postings: Callable[[], Postings | None]
    model: str | None = None  # the embedding model the base recorded (``pipeline.embedders.check_model``)
    graph: BaseGraph | None = None  # the base's graph as read so far (pipeline.store.graph)

    def created_at(self, ids: list[str]) -> dict[str, datetime]:
        """``created_at`` of the live memories among ``ids``: a delta's, else the base's."""
        members = self.overlay.members
        out = {m: members[m].created_at for m in ids if m in members}
        rest = [m for m in ids if m not in members]
        if self.cursor is not None and rest:
            out.update(created_at_of(self.cursor, rest))
        return out


class Reader:
    """The current ``Snapshot`` of ``data_dir`` for one process (thread-safe).

    Given ``lake`` (``store.engine = lake``: ``pipeline.store.lake.follow.reader_for``
    makes the reader the settings name), it follows the lake instead of
    ``MANIFEST``: a base built for a snapshot, the snapshots since merged over
    it, the catalog asked at most every ``store.poll_ms``."""

    def __init__(self, data_dir: Path, *, memory_limit: str | None = None, lake: Source | None = None):
        self.data_dir = data_dir
        self.memory_limit = memory_limit
        self._lock = threading.RLock()
        self._current: Snapshot | None = None
        self._loading: threading.Thread | None = None
        self._pending: Snapshot | None = None
        self._failed: BaseException | None = None
        self.lake = lake
        self._past: dict[int, Snapshot] = {}  # as_of snapshots, oldest asked first
        self._past_at: dict[int, int] = {}  # the lake's latest snapshot when each was built

    # -- public -----------------------------------------------------------------
    def snapshot(self, *, fresh: bool = False) -> Snapshot | None:
        """The newest published state (None when nothing was written yet).

        A new base is loaded in the background after the first one; until it
        is ready the old base answers with the new deltas merged. On the lake,
        the catalog is asked at most every ``store.poll_ms`` unless ``fresh``.
        """
        if self.lake is not None:
            with self._lock:
                cur = self._current
                snap = self.lake.follow(cur, fresh=fresh)
                if cur is not None and snap is not cur and (snap is None or snap.store is not cur.store):
                    cur.close()
                self._current = snap
                return snap
        with self._lock:
            if self._pending is not None:
                self._swap()
            for _ in range(5):
                manifest = segments.read_manifest(self.data_dir)
                if manifest is None:
                    return None
                try:
                    return self._follow(manifest)
                except FileNotFoundError:
                    continue  # compaction removed a file between reading MANIFEST and opening it
            raise StoreError(f"the store in {self.data_dir} kept changing while reading it")

    def at_least(self, version: int, wait_s: float) -> Snapshot | None:
        """The newest state, at ``version`` or later (read-your-writes: a search's
        ``min_version``). The state this process holds answers when it is new
        enough; else the store is asked at once (on the lake, not waiting out
        ``store.poll_ms``) and again every few milliseconds for at most ``wait_s``,
        then ``VersionNotReachedError`` names ``min_version``."""
        snap = self.snapshot()
        if version == 0 or (snap is not None and self._reached(snap) >= version):
            return snap
        start = time.monotonic()
        pause = 0.005
        while True:
            snap = self.snapshot(fresh=True)
            if snap is not None and self._reached(snap) >= version:
                return snap
            waited = time.monotonic() - start
            if waited >= wait_s:
                raise VersionNotReachedError(version, snap.version if snap is not None else None, waited * 1000.0)
            time.sleep(min(pause, wait_s - waited))
            pause = min(pause * 2, 0.05)

    def _reached(self, snap: Snapshot) -> int:
        """The newest version ``snap`` answers for: its own, or on the lake a
        later one when only audit commits came after it (``Follower.reached``)."""
        return snap.version if self.lake is None else self.lake.reached(snap.version)

    def past_snapshot(self, at: int | datetime) -> int:
        """The snapshot ``as_of`` names: a snapshot id as it is, a time the last
        snapshot committed by then (lake only); ``StoreError`` naming
        ``store.engine`` on the segment store."""
        if self.lake is None:
            raise StoreError("store.engine: as_of reads a past snapshot, which only the lake engine keeps "
                             "(DIMPLE_STORE__ENGINE=lake)")
        return at if isinstance(at, int) else self.lake.snapshot_for(at)

    def as_of(self, at: int | datetime) -> Snapshot:
        """The store as it was at ``at`` (a snapshot or a time, ``past_snapshot``;
        lake only; the last two asked are kept open)."""
        snapshot = self.past_snapshot(at)
        assert self.lake is not None
        with self._lock:
            snap = self._past.pop(snapshot, None)
            built = self._past_at.pop(snapshot, 0)
            # expired since (an erase: refused), or written since: a forget
            # committed after it was built must leave it too
            if snap is not None and not (self.lake.readable(snapshot) and self.lake.unchanged_since(built)):
                snap.close()
                snap = None
            if snap is None:
                built = self.lake.latest()  # asked first: a write in between makes the next use build again
                snap = self.lake.view_at(snapshot)
            self._past[snapshot], self._past_at[snapshot] = snap, built
            while len(self._past) > 2:
                oldest = next(iter(self._past))
                self._past.pop(oldest).close()
                self._past_at.pop(oldest, None)
            return snap

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until a background base load (if any) is done and in use."""
        if self.lake is not None:  # ask now (a newer base starts loading), wait for it, put it in use
            self.snapshot(fresh=True)
            self.lake.wait_ready(timeout)
            self.snapshot(fresh=True)
            return
        thread = self._loading
        if thread is not None:
            thread.join(timeout)
        with self._lock:
            if self._pending is not None:
                self._swap()
            if self._failed is not None:
                failed, self._failed = self._failed, None
                raise failed

    def close(self) -> None:
        with self._lock:
            if self._current is not None:
                self._current.close()
            self._current = None
            for past in self._past.values():
                past.close()
            self._past.clear()
            self._past_at.clear()
            if self.lake is not None:
                self.lake.close()

    # -- internals --------------------------------------------------------------
    def _follow(self, manifest: segments.Manifest) -> Snapshot:
        cur = self._current
        if cur is not None and cur.version == manifest.version:
            return cur
        if cur is None or cur.base != manifest.base:
            if cur is None or cur.store is None or cur.base != manifest.compacted_base:
                fresh = self._load(manifest, {})
                if cur is not None:
                    cur.close()
                self._current = fresh
                return fresh
            # meanwhile: the old base, every delta the compaction merged, and those written since
            extra = [d for d in manifest.consumed + manifest.deltas if d.seq not in cur.deltas]
            try:
                extended = self._extend(cur, manifest.version, extra)
            except FileNotFoundError:
                if not manifest.erased:
                    raise
                # the merged deltas held forgotten memories and are gone
                # (``Manifest.erased``): this reader had not read them all
                fresh = self._load(manifest, {})
                cur.close()
                self._current = fresh
                return fresh
            if self._loading is None:
                assert cur._uses is not None
                self._start_background(manifest, index_wanted=cur._index is not None,
                                       postings_wanted=cur._uses.postings_loaded)
            self._current = extended
            return self._current
        loaded = {d.seq for d in manifest.deltas}
        if not set(cur.deltas) <= loaded:  # a delta vanished without a new base: reload whole
            fresh = self._load(manifest, {})
            cur.close()
            self._current = fresh
            return fresh
        extra = [d for d in manifest.deltas if d.seq not in cur.deltas]
        self._current = self._extend(cur, manifest.version, extra)
        return self._current

    def _extend(self, cur: Snapshot, version: int, extra: list[segments.DeltaRef]) -> Snapshot:
        return cur.extend(version, {ref.seq: Delta.load(self.data_dir, ref) for ref in extra})

    def _load(self, manifest: segments.Manifest, cache: dict, index_wanted: bool = False,
              postings_wanted: bool = False) -> Snapshot:
        path = None
        if manifest.base is not None:
            path = self.data_dir / manifest.base
            if not path.exists():
                raise FileNotFoundError(path)  # removed by a compaction since MANIFEST was read
        snap = Snapshot.open(path, manifest.version, base=manifest.base, memory_limit=self.memory_limit)
        try:
            deltas = {d.seq: cache.get(d.seq) or Delta.load(self.data_dir, d) for d in manifest.deltas}
            snap = snap.extend(manifest.version, deltas)
            if index_wanted:
                snap.index()
            if postings_wanted:
                snap.postings()
            return snap
        except BaseException:
            if snap.store is not None:
                snap.store.close()
            raise

    def _start_background(self, manifest: segments.Manifest, index_wanted: bool, postings_wanted: bool) -> None:
        def run() -> None:
            try:
                snap = self._load(manifest, {}, index_wanted, postings_wanted)
            except BaseException as exc:  # the next snapshot() loads in the foreground
                with self._lock:
                    self._failed = exc
                    self._loading = None
                return
            with self._lock:
                self._pending = snap
                self._loading = None

        self._loading = threading.Thread(target=run, name="dimple-base-load", daemon=True)
        _LOADING.add(self._loading)
        self._loading.start()

    def _swap(self) -> None:
        """Put the background-loaded base in use, with the deltas published since it."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        manifest = segments.read_manifest(self.data_dir)
        if manifest is None or manifest.base != pending.base:
            pending.close()  # another compaction published meanwhile: the next snapshot() follows it
            return
        extra = [d for d in manifest.deltas if d.seq not in pending.deltas]
        pending = self._extend(pending, manifest.version, extra)
        old, self._current = self._current, pending
        if old is not None and old.store is not pending.store:
            old.close()


# DuckDB aborts the process when it exits while a thread is inside a query:
# a base still loading in the background is waited for at exit.
_LOADING: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


@atexit.register
def _join_loading() -> None:
    for thread in list(_LOADING):
        thread.join()


def _dim(store: Store | None) -> int:
    return store.info.embedding_dim if store is not None else 0
