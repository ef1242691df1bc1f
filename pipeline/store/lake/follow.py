"""One process following the lake (``store.engine = lake``): what
``pipeline.store.reader.Reader`` reads instead of ``MANIFEST`` (docs/LAKE.md).

The process holds a **base** (a base file built by ``derive.build_base`` for
a snapshot ``B``, under ``<data dir>/indexes``, outside the lake's data path)
and merges the snapshots after it as deltas (``Snapshot.extend``). It asks
the catalog for its latest snapshot at most every ``store.poll_ms``, and at
once when a caller needs the newest state (a write) or this process
committed a snapshot it has not read yet (read-your-writes); when the
snapshot moved, it reads ``changes_since`` its own snapshot only.

A base is built by the write that finds none (the lake's first write, as the
segment store's first write goes straight into a base) or by a large write
(``compact_delta_memories`` or more memories), at that write's snapshot; a
process loading later takes the newest base at or before the latest snapshot.
Builders racing for one snapshot build apart and link the result into place:
one wins, the others' equal files are dropped.

A running process switches to a newer base when it sees one (in the
foreground, at its next poll). Not yet: loading it in the background, bases
found through the catalog (other hosts), and compaction of the lake's files.
"""

from __future__ import annotations

import os
import re
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import numpy as np

from pipeline.errors import InputError, StoreError
from pipeline.settings import Settings
from pipeline.store import segments
from pipeline.store.lake.catalog import Catalog, NoLake, attach
from pipeline.store.lake.commit import snapshot_of_write
from pipeline.store.lake.derive import build_base, deltas_since, open_view
from pipeline.store.lake.records import Committed, LakeWrite
from pipeline.store.lake.store import Lake
from pipeline.store.overlay import Delta
from pipeline.store.reader import Reader, Snapshot

_BASE = re.compile(r"base-(\d+)\.duckdb")


def index_dir(settings: Settings) -> Path:
    """Where this host keeps the bases built from the lake (never inside the lake's data path)."""
    return settings.data_dir / "indexes"


def base_file(settings: Settings, snapshot: int) -> Path:
    return index_dir(settings) / f"base-{snapshot}.duckdb"


def bases(settings: Settings) -> dict[int, Path]:
    """The base files built so far, by the snapshot each holds."""
    folder = index_dir(settings)
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): folder / m.group(0) for p in folder.iterdir() if (m := _BASE.fullmatch(p.name))}


class Follower:
    """The lake side of one process's ``Reader``: its open ``Lake`` (one
    connection, used under ``lock``) and when it last asked for the latest snapshot."""

    def __init__(self, settings: Settings, *, memory_limit: str | None = None):
        self.settings = settings
        self.memory_limit = memory_limit
        self.lock = threading.RLock()
        self._lake: Lake | None = None
        self._attached: tuple[duckdb.DuckDBPyConnection, Catalog, Path] | None = None
        self._polled = float("-inf")
        self._wanted = 0  # a snapshot this process committed: the next read reaches it
        self._base_at = -1  # the snapshot of the base this process reads (-1: none yet)

    def lake(self, embedding_dim: int | None = None) -> Lake | None:
        """The open lake; None while it has no record tables and ``embedding_dim``
        is not given (given, a new lake is created for it)."""
        with self.lock:
            if self._lake is None:
                if self._attached is None:  # attached once: loading the extensions takes most of a second
                    self._attached = attach(self.settings)
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
        (no ``current``, its snapshot expired, or another process built a newer
        base: loaded here, in the foreground, which keeps the overlay to the
        writes since the newest base). None: nothing written yet."""
        now = time.monotonic()
        current_version = current.version if current is not None else 0
        if not fresh and current_version >= self._wanted and now - self._polled < self.settings.store.poll_ms / 1000.0:
            return current
        with self.lock:
            lake = self.lake()
            self._polled = now
            if lake is None:
                return None
            latest = lake.latest_snapshot()
            newer = any(self._base_at < b <= latest for b in bases(self.settings))
            if current is not None and current.version == latest and not newer:
                return current
            if current is not None and current.store is not None and not newer:
                try:
                    changes = lake.changes_since(current.version, latest)
                except StoreError:
                    pass  # expired: load a base whole
                else:
                    return current.extend(latest, deltas_since(changes, current.router(), self.settings,
                                                               lake.info.embedding_dim))
            return self._load(lake, latest)

    def _load(self, lake: Lake, latest: int) -> Snapshot | None:
        held = {b: p for b, p in bases(self.settings).items() if b <= latest}
        for snapshot in sorted(held, reverse=True)[:1]:
            try:
                view = open_view(lake, held[snapshot], self.settings, until=latest, memory_limit=self.memory_limit)
            except StoreError:
                break  # its snapshot expired from the lake: build one at the latest
            self._base_at = snapshot
            return view
        if not held and lake.count(at=latest) == 0:
            return None  # nothing remembered yet
        view = open_view(lake, self.build(latest), self.settings, until=latest, memory_limit=self.memory_limit)
        self._base_at = latest
        return view

    def view_at(self, snapshot: int) -> Snapshot:
        """The store as it was at ``snapshot`` (``as_of``), memories forgotten
        since left out: the newest base at or before it plus the snapshots up to
        it (``open_view(until=snapshot)``), else a base built at it (a whole
        build: seconds per 100k memories, kept in ``indexes/`` for the next),
        then the forgets committed after it as one delta."""
        with self.lock:
            lake = self.lake()
            latest = lake.latest_snapshot() if lake is not None else 0
            if lake is None or not 0 < snapshot <= latest:
                raise InputError("as_of", f"no snapshot {snapshot} in the lake (its latest is {latest})")
            held = {b: p for b, p in bases(self.settings).items() if b <= snapshot}
            base = held[max(held)] if held else self.build(snapshot)
            dim = lake.info.embedding_dim
            try:
                view = open_view(lake, base, self.settings, until=snapshot, memory_limit=self.memory_limit)
                forgotten = sorted({i for done in lake.changes_since(snapshot, latest).writes(dim)
                                    for i in done.forgotten})
            except StoreError as exc:
                raise InputError("as_of", f"snapshot {snapshot} can no longer be read: {exc}") from None
            if not forgotten:
                return view
            empty = np.zeros((0, dim), np.float32)
            return view.extend(snapshot, {latest + 1: Delta(seq=latest + 1, memories=[], vectors=empty,
                                                            forget=forgotten)})

    def snapshot_for(self, at: datetime) -> int:
        """The snapshot ``as_of`` a time stands for: the last one committed at
        or before ``at`` (UTC when it names no zone). A time still to come is
        refused: a commit before it would change the answer between one stage
        of a query and the next; a past time's snapshot never changes."""
        when = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
        if when > datetime.now(UTC):
            raise InputError("as_of", f"{when.isoformat()} is in the future")
        with self.lock:
            lake = self.lake()
            if lake is None:
                raise InputError("as_of", "no snapshot in the lake yet")
            return lake.snapshot_at(when)

    def build(self, snapshot: int) -> Path:
        """A base file for ``snapshot`` (built unless one exists)."""
        target = base_file(self.settings, snapshot)
        if target.exists():
            return target
        work = target.with_name(f".{target.stem}.{os.getpid()}.{threading.get_ident()}.duckdb")
        segments.remove_file(work)
        with self.lock:
            lake = self.lake()
            if lake is None:
                raise StoreError("the lake has no record tables: nothing to build a base from")
            build_base(lake, snapshot, work, self.settings)
        try:
            os.link(work, target)  # never over another builder's file: a reader may have it open
        except FileExistsError:
            pass
        finally:
            segments.remove_file(work)
        segments.fsync_dir(target.parent)
        return target

    def written(self, write_id: str) -> int | None:
        """The snapshot of the write ``write_id`` when the lake holds it (a redelivered message), else None."""
        with self.lock:
            lake = self.lake()
            if lake is None or not lake.written(write_id):
                return None
            return snapshot_of_write(lake.con, write_id)

    def commit(self, write: LakeWrite, embedding_dim: int | None) -> Committed:
        """``write`` as one catalog transaction; this process's next read reaches its snapshot."""
        with self.lock:
            lake = self.lake(embedding_dim)
            if lake is None:
                raise StoreError("the lake has no record tables and the write carries no embeddings to create them")
            done = lake.commit(write)
            self._wanted = max(self._wanted, done.snapshot)
            return done

    def close(self) -> None:
        with self.lock:
            if self._lake is not None:
                self._lake.close()
            elif self._attached is not None:
                self._attached[0].close()
            self._lake = self._attached = None


def reader_for(settings: Settings, *, memory_limit: str | None = None) -> Reader:
    """The ``Reader`` of the store ``settings`` name: the lake's (``store.engine =
    lake``) or the segment store's. On the lake, a data dir holding a segment
    store not yet migrated is refused (``segments.refuse_unmigrated``)."""
    lake = None
    if settings.store.engine == "lake":
        segments.refuse_unmigrated(settings.data_dir)
        lake = Follower(settings, memory_limit=memory_limit)
    return Reader(settings.data_dir, memory_limit=memory_limit, lake=lake)
