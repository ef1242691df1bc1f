"""What one process reads: a base (the derived indexes compaction built for
one snapshot of the lake) and the snapshots since, merged over it as deltas,
kept current by the lake's ``Follower`` (``pipeline.store.lake.follow``),
which asks the catalog at most every ``store.poll_ms``.

- A write commits a snapshot: only its changes are read and the overlay
  rebuilt; the base stays open.
- A compaction lists a new base: it is loaded in the background while
  queries keep being answered from the old base plus every snapshot since;
  then the new base takes over.

``read_segments`` reads a data dir of the earlier segment store once (a
``MANIFEST`` over a base and delta files), for ``dimple migrate``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import duckdb

from pipeline.errors import StoreError, VersionNotReachedError
from pipeline.store import segments
from pipeline.store.database import Store, created_at_of, label_lists
from pipeline.store.fulltext import Postings, fulltext_totals, index_exists
from pipeline.store.graph import BaseGraph, GraphPart
from pipeline.store.hostcache import HostCache
from pipeline.store.overlay import Delta, Overlay
from pipeline.store.vector import TreeRouter, VectorIndex

log = logging.getLogger("dimple.store")


class Source(Protocol):
    """Where a ``Reader`` learns of new state: the lake
    (``pipeline.store.lake.follow.Follower``)."""

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
        # what search.augment reads of this base: from its graph part in the host cache where it has a
        # folder there, else by SQL, kept for the next queries
        self.graph = BaseGraph(part=self.graph_part if cache is not None else None)
        self._postings: Postings | None = None
        self._postings_read = False
        self._postings_lock = threading.Lock()
        self._graph_part: GraphPart | None = None
        self._graph_part_read = False
        self._graph_part_lock = threading.Lock()

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

    def graph_part(self) -> GraphPart | None:
        """The base's graph part in the host cache (``pipeline.store.graph.GraphPart``), read or
        mapped on first use; None without a base or a host cache folder, or when it cannot be
        read (``BaseGraph`` then reads by SQL: the part is an economy, not a need)."""
        with self._graph_part_lock:  # a first read takes seconds at 1M memories
            if not self._graph_part_read:
                if self.store is not None and self.cache is not None:
                    cur = self.store.cursor()
                    try:
                        self._graph_part = self.cache.graph(cur)
                    except (duckdb.Error, OSError, ValueError, StoreError) as exc:
                        log.warning("the base's graph is read by SQL: its host cache part failed (%s)", exc)
                    finally:
                        cur.close()
                self._graph_part_read = True
            return self._graph_part

    def router(self) -> TreeRouter | None:
        """The base tree's router for new memories, read on first use (None without a base)."""
        if self._router is None and self.store is not None:  # writes are serialised: no lock
            cur = self.store.cursor()
            try:
                self._router = TreeRouter.load(cur)
            finally:
                cur.close()
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
        # a cursor of this thread's own: the base's connection answers one statement at a time,
        # and the process's other threads read it too (``writes.live_view``)
        cur = self.store.cursor() if self.store is not None else None
        try:
            overlay = Overlay.build(version, [merged[s] for s in sorted(merged)], cur, _dim(self.store),
                                    self._uses.totals, self._uses.terms)
        finally:
            if cur is not None:
                cur.close()
        return Snapshot(version=version, base=self.base, store=self.store, overlay=overlay, deltas=merged,
                        _index=self._index, _uses=self._uses)

    def index(self) -> VectorIndex | None:
        """The base's vector index, loaded on first use (None without a base)."""
        with self._lock:
            if self._index is None and self.store is not None:
                assert self._uses is not None
                cache, dim = self._uses.cache, self.store.info.embedding_dim
                cur = self.store.cursor()
                try:
                    self._index = (cache.vector_index(cur, self.version, dim) if cache is not None
                                   else VectorIndex.load(cur, self.version, dim))
                finally:
                    cur.close()
            return self._index

    def postings(self) -> Postings | None:
        """The base's full-text postings in memory (``pipeline.store.fulltext.postings``), read on first use."""
        assert self._uses is not None
        return self._uses.postings()

    def graph_part(self) -> GraphPart | None:
        """The base's graph in the host cache (``pipeline.store.graph.GraphPart``), read or mapped on first use."""
        assert self._uses is not None
        return self._uses.graph_part()

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
        held: set[str] = set()
        if self.store is not None:
            with self.view() as view:
                held = set(label_lists(view.cursor)[0])
        return sorted(held | {m.namespace for m in self.overlay.members.values()})

    @contextmanager
    def view(self) -> Iterator[View]:
        """This snapshot for one stage of one thread: a cursor on its base
        (``LazyCursor``: opened at first use; None without a base), its deltas
        and its vector index, all of the same state."""
        assert self._uses is not None
        self._uses.enter()
        try:
            cur = LazyCursor(self.store.cursor) if self.store is not None else None
            try:
                yield View(cursor=cur, overlay=self.overlay, index=self.index, postings=self.postings,
                           model=self.store.info.embedding_model if self.store is not None else None,
                           graph=self._uses.graph)
            finally:
                if cur is not None:
                    cur.close()
        finally:
            self._uses.leave()


class LazyCursor:
    """A cursor on a base, opened by its first use. A stage that answers from
    what the process holds (the postings, the vector index, the base's graph)
    asks no SQL, and opening and closing a DuckDB cursor costs ~0.1 ms: four
    of a hybrid query's stages would pay it for nothing."""

    __slots__ = ("_open", "_cur")

    def __init__(self, open_cursor: Callable[[], duckdb.DuckDBPyConnection]):
        self._open: Callable[[], duckdb.DuckDBPyConnection] | None = open_cursor
        self._cur: duckdb.DuckDBPyConnection | None = None

    @property
    def opened(self) -> bool:
        return self._cur is not None

    def __getattr__(self, name: str) -> Any:
        if self._cur is None:
            if self._open is None:  # as a closed cursor refuses: its base may be retired since
                raise duckdb.ConnectionException("this stage's view of the store has ended")
            self._cur = self._open()
        return getattr(self._cur, name)

    def close(self) -> None:
        self._open = None
        if self._cur is not None:
            self._cur.close()
            self._cur = None


@dataclass
class View:
    """One snapshot as one stage of one thread reads it."""

    cursor: LazyCursor | None  # on the base, opened at first use
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
    """The current ``Snapshot`` of the lake for one process (thread-safe).

    ``lake`` (``pipeline.store.lake.follow.reader_for`` makes the reader the
    settings name) gives a base built for a snapshot with the snapshots since
    merged over it, the catalog asked at most every ``store.poll_ms``."""

    def __init__(self, data_dir: Path, *, lake: Source, memory_limit: str | None = None):
        self.data_dir = data_dir
        self.memory_limit = memory_limit
        self._lock = threading.RLock()
        self._current: Snapshot | None = None
        self.lake = lake
        self._past: dict[int, Snapshot] = {}  # as_of snapshots, oldest asked first
        self._past_at: dict[int, int] = {}  # the lake's latest snapshot when each was built

    def snapshot(self, *, fresh: bool = False) -> Snapshot | None:
        """The newest state (None when nothing was written yet).

        A new base is loaded in the background after the first one; until it
        is ready the old base answers with the snapshots since merged. The
        catalog is asked at most every ``store.poll_ms`` unless ``fresh``.
        """
        with self._lock:
            cur = self._current
            snap = self.lake.follow(cur, fresh=fresh)
            if cur is not None and snap is not cur and (snap is None or snap.store is not cur.store):
                cur.close()
            self._current = snap
            return snap

    def at_least(self, version: int, wait_s: float) -> Snapshot | None:
        """The newest state, at ``version`` or later (read-your-writes: a search's
        ``min_version``). The state this process holds answers when it is new
        enough; else the catalog is asked at once (not waiting out
        ``store.poll_ms``) and again every few milliseconds for at most ``wait_s``,
        then ``VersionNotReachedError`` names ``min_version``."""
        snap = self.snapshot()
        if version == 0 or (snap is not None and self.lake.reached(snap.version) >= version):
            return snap
        start = time.monotonic()
        pause = 0.005
        while True:
            snap = self.snapshot(fresh=True)
            # its own version, or a later one when only audit commits came after it (``Follower.reached``)
            if snap is not None and self.lake.reached(snap.version) >= version:
                return snap
            waited = time.monotonic() - start
            if waited >= wait_s:
                raise VersionNotReachedError(version, snap.version if snap is not None else None, waited * 1000.0)
            time.sleep(min(pause, wait_s - waited))
            pause = min(pause * 2, 0.05)

    def past_snapshot(self, at: int | datetime) -> int:
        """The snapshot ``as_of`` names: a snapshot id as it is, a time the last
        snapshot committed by then."""
        return at if isinstance(at, int) else self.lake.snapshot_for(at)

    def as_of(self, at: int | datetime) -> Snapshot:
        """The store as it was at ``at`` (a snapshot or a time, ``past_snapshot``;
        the last two asked are kept open)."""
        snapshot = self.past_snapshot(at)
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
        """Block until a background base load (if any) is done and in use: ask
        now (a newer base starts loading), wait for it, put it in use."""
        self.snapshot(fresh=True)
        self.lake.wait_ready(timeout)
        self.snapshot(fresh=True)

    def close(self) -> None:
        with self._lock:
            if self._current is not None:
                self._current.close()
            self._current = None
            for past in self._past.values():
                past.close()
            self._past.clear()
            self._past_at.clear()
            self.lake.close()


def read_segments(data_dir: Path) -> tuple[segments.Manifest, Snapshot] | None:
    """The segment store in ``data_dir`` as its ``MANIFEST`` publishes it: its
    base and every delta over it (None without a manifest). For ``dimple
    migrate``, which holds the store's locks meanwhile; a compaction of an
    earlier version that removed a file between the manifest and the open is
    read again."""
    for _ in range(5):
        manifest = segments.read_manifest(data_dir)
        if manifest is None:
            return None
        path = data_dir / manifest.base if manifest.base is not None else None
        try:
            if path is not None and not path.exists():
                raise FileNotFoundError(path)
            snap = Snapshot.open(path, manifest.version, base=manifest.base)
            try:
                return manifest, snap.extend(manifest.version, {d.seq: Delta.load(data_dir, d)
                                                                for d in manifest.deltas})
            except BaseException:
                snap.close()
                raise
        except FileNotFoundError:
            continue
    raise StoreError(f"the segment store in {data_dir} kept changing while reading it")


def _dim(store: Store | None) -> int:
    return store.info.embedding_dim if store is not None else 0
