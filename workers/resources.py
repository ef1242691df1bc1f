"""Heavy per-process resources, loaded lazily once: the embedder, and the
read-only store (base, vector index and deltas, following each published write).

``Resources`` is what a process lends its stages
(``pipeline.stages.registry.Resources``: ``settings()``, ``embedder()`` and
``view()``); ``current()`` is this process's one instance. A worker loads
what its queues need up front (``warm``); a forked child never inherits its
parent's DuckDB connections.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import duckdb

from pipeline.audit import lake as audit_lake
from pipeline.contracts import Batch
from pipeline.embedders import Embedder, make_embedder
from pipeline.errors import InputError, StoreError
from pipeline.store.database import Store
from pipeline.store.lake.follow import Follower, reader_for
from pipeline.store.reader import Reader, Snapshot, View
from pipeline.store.tuned import overlay, read_tuned
from pipeline.store.vector import VectorIndex, compile_kernels

from .settings import WorkerSettings, get_settings

# How often a process looks whether the store's tuned settings changed: a query
# asks for its settings ~15 times (embedded, all stages), a stat cost 2-30 us
# here (the higher under load), so one look per 0.2 s keeps it off the query's
# time while an --apply still reaches every worker within 0.2 s.
TUNED_CHECK_S = 0.2


class _Frozen:
    """This process's use of ``gc.freeze``: what a serving process loaded (the
    model, a store's base and caches, its modules: ~107,000 tracked objects on
    the demo store) is long-lived, and every full collection walked it all
    (65 ms on the demo store, 148 ms on a busy machine, every ~300 queries:
    ``ops.bench.latency``'s worst queries). Frozen, the collector no longer
    looks at it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.settled = False  # one full collection and freeze done in this process
        self.pending = False  # thawed: freeze again after the next full collection

    def settle(self) -> None:
        """After a process's first base loads (a worker's warm-up loads it): one
        full collection, then everything alive is frozen. Nothing where the
        collector is off (a one-query process:
        ``workers.cli.commands.one_query_process``)."""
        if not gc.isenabled():
            return
        with self.lock:
            self.settled, self.pending = True, False
        gc.unfreeze()
        gc.collect()
        gc.freeze()

    def loaded(self) -> None:
        """After a load that replaces nothing (an embedder): settled the first
        time; later, what was loaded joins what is frozen (``gc.freeze`` alone:
        no collection)."""
        if not gc.isenabled():
            return
        if not self.settled:
            self.settle()
        elif not self.pending:  # thawed: the next full collection freezes it all
            gc.freeze()

    def thaw(self) -> None:
        """A base replaced by another (a compaction, another data dir): what the
        old one held must be collectable again. Everything frozen goes back to
        the collector's oldest generation, and is frozen again right after the
        next full collection it makes by itself (``after_collection``), so no
        collection is added here."""
        if gc.isenabled():
            with self.lock:
                gc.unfreeze()
                self.pending = True

    def after_collection(self, phase: str, info: dict) -> None:
        if phase == "stop" and info.get("generation") == 2 and self.pending:
            self.pending = False
            gc.freeze()


_FROZEN = _Frozen()
gc.callbacks.append(_FROZEN.after_collection)


class Resources:
    """One process's resources, each loaded at its first use and kept."""

    def __init__(self, settings: WorkerSettings | None = None) -> None:
        self._lock = threading.RLock()
        self._settings = settings
        self._embedders: dict[bool, Embedder] = {}  # by bulk: the query embedder, the bulk (ingest) embedder
        self._reader: Reader | None = None
        self._inherited: list[Any] = []  # a forked child's copies of its parent's connections, never used
        # (settings as configured, the tuned file's stat key or the lake's snapshot, those settings with the
        # store's tuned values)
        self._effective: tuple[WorkerSettings, Any, WorkerSettings] | None = None
        self._tuned_due = 0.0  # monotonic time the tuned file is next looked at
        self._pin = threading.local()  # .snap: the as_of snapshot this thread's stage reads (``pinned``)
        self._settled_base: int | None = None  # id() of the last base loaded, kept once set (``_Frozen``)

    def configure(self, settings: WorkerSettings) -> None:
        """Use ``settings`` from now on.

        The open store is kept unless the data dir changes; the model is kept
        unless the model or device changes.
        """
        with self._lock:
            if self._effective is not None and settings is self._effective[2]:
                settings = self._effective[0]  # settings() handed back: keep them apart from the store's tuned values
            previous = self._settings
            self._tuned_due = 0.0  # the next settings() looks at the store's tuned file
            if previous is not None and (
                settings.embedding_model != previous.embedding_model
                or settings.embedding_device != previous.embedding_device
            ):
                self._embedders.clear()
            self._settings = settings
            if previous is None or previous.data_dir != settings.data_dir:
                self.close_store()

    def settings(self) -> WorkerSettings:
        """The settings in use: those configured, else the process's
        (``get_settings``), with the store's tuned fusion settings over them
        (``pipeline.store.tuned``). Whether they changed is looked at (the
        snapshot this process follows, which it polls anyway) at most every
        ``TUNED_CHECK_S``, and at the first call after ``configure``, so a
        ``dimple tune --apply`` or ``--reset`` made while this process runs
        (on any host) applies within that time plus ``store.poll_ms``; they
        are read only when the snapshot moved."""
        with self._lock:
            if self._settings is None:
                self._settings = get_settings()
            base = self._settings
            if not base.use_tuned:
                return base
            cached, now = self._effective, time.monotonic()
            if cached is not None and cached[0] is base and now < self._tuned_due:
                return cached[2]
            self._tuned_due = now + TUNED_CHECK_S
            return self._lake_tuned(base, cached)

    def _lake_tuned(self, base: WorkerSettings, cached) -> WorkerSettings:
        """``settings()``'s look at the tuned settings: a lake table, read
        (one catalog read) when the snapshot this process follows moved since
        they were read (an ``--apply`` is a commit): every host serves the same.
        A client of the workers that has not opened the store opens no lake for
        it (the ``search.fuse`` worker resolves the fusion a query leaves open)."""
        if self._reader is None and not base.embedded:
            self._effective = (base, None, base)
            return base
        try:
            if self._reader is None:
                self._reader = reader_for(base, memory_limit=base.query_memory_limit)
            snap = self._reader.snapshot()
        except StoreError:  # the lake unreachable or refused: the store's own calls say why
            return cached[2] if cached is not None and cached[0] is base else base
        key = ("lake", snap.version if snap is not None else 0)
        if cached is not None and cached[0] is base and cached[1] == key:
            return cached[2]
        follower = self._reader.lake
        # a tuned row this dimple cannot read raises (never silently the defaults)
        effective = overlay(base, read_tuned(base, follower if isinstance(follower, Follower) else None))
        self._effective = (base, key, effective)
        return effective

    def embedder(self, bulk: bool = False) -> Embedder:
        """This process's embedder for queries, or (``bulk``) for ingest (``make_embedder``)."""
        with self._lock:
            if bulk not in self._embedders:
                self._embedders[bulk] = make_embedder(self.settings(), bulk=bulk)
                _FROZEN.loaded()
            return self._embedders[bulk]

    def reader(self) -> Reader:
        """This process's view of the published store (``pipeline.store.reader``)."""
        with self._lock:
            if self._reader is None:
                settings = self.settings()  # this opens the reader (the tuned settings are in the lake)
                if self._reader is None:
                    self._reader = reader_for(settings, memory_limit=settings.query_memory_limit)
                    self._tuned_due = 0.0  # on the lake: the tuned settings are read through it at the next call
            return self._reader

    def snapshot(self) -> Snapshot | None:
        """The published base and deltas, or None when nothing was written yet.

        Follows every published write at the next task: a new delta is read and
        merged at once; a new base (after compaction) loads in the background
        while the old one answers.
        """
        snap = self.reader().snapshot()
        base = id(snap.store) if snap is not None and snap.store is not None else None
        if base is not None and base != self._settled_base:  # a base loaded: the first settles, a later one thaws
            first, self._settled_base = self._settled_base is None, base
            if first:
                _FROZEN.settle()
            else:
                _FROZEN.thaw()
        return snap

    def reach(self, batch: Batch | list[Batch]) -> None:
        """Bring this process's store to the highest ``min_version`` the batch's
        queries ask for (``Reader.at_least``: at once, waiting at most
        ``store.min_version_wait_ms``), so the stage reads a state that new or newer."""
        batches = batch if isinstance(batch, list) else [batch]
        wanted = max((s.query.options.min_version or 0 for b in batches for s in b.states), default=0)
        if wanted:
            self.reader().at_least(wanted, self.settings().store.min_version_wait_ms / 1000.0)

    @contextmanager
    def pinned(self, batch: Batch | list[Batch]) -> Iterator[None]:
        """Within: this thread's ``view()`` reads the snapshot the batch's
        queries ask for with ``as_of`` (``Reader.as_of``), none asked: the newest."""
        batches = batch if isinstance(batch, list) else [batch]
        wanted = {s.query.options.as_of for b in batches for s in b.states}
        if wanted <= {None}:  # none asked (or a batch of no queries): the newest
            yield
            return
        reader = self.reader()
        snapshots = {None if at is None else reader.past_snapshot(at) for at in wanted}  # a time: its snapshot
        if len(snapshots) > 1:
            raise InputError("as_of", "one batch reads one snapshot: send queries with other as_of values "
                                      "(or none) in other batches")
        snapshot = snapshots.pop()
        assert snapshot is not None
        self._pin.snap = reader.as_of(snapshot)
        try:
            yield
        finally:
            self._pin.snap = None

    def store(self) -> Store | None:
        """The published base, read-only (None when none exists yet)."""
        snap = self.snapshot()
        return snap.store if snap is not None else None

    def index(self) -> VectorIndex | None:
        snap = self.snapshot()
        return snap.index() if snap is not None else None

    @contextmanager
    def view(self) -> Iterator[View | None]:
        """One published state for one stage of this thread (``Snapshot.view``),
        None when nothing was written yet."""
        snap = getattr(self._pin, "snap", None) or self.snapshot()
        if snap is None:
            yield None
            return
        with snap.view() as v:
            yield v

    def close_store(self) -> None:
        """Release the store (another data dir, or shutdown), and the audit's
        connections to a lake (``pipeline.audit.lake``)."""
        with self._lock:
            if self._reader is not None:
                self._reader.close()
            self._reader = None
            audit_lake.release_all()

    def warm(self, queues: Iterable[str]) -> list[tuple[str, float]]:
        """Load now, in this process, what the tasks of ``queues`` use (routes in
        ``workers.app``): ``embed`` and ``ingest`` the query embedder (an agent's
        write embeds a few texts; a batch of more than ``embed_batch_size`` loads
        the bulk embedder at its first, ``writes._embedder_for``), ``ingest`` and
        ``audit`` what DuckDB loads at its first bound parameter, ``search`` the
        published store, its vector index, full-text postings and graph (if a store is
        published yet). The embedder embeds one text, so nothing is left to load
        on the first task. Returns (what was loaded, seconds) pairs."""
        wanted = set(queues)
        loaded = []
        if wanted & {"embed", "ingest"}:
            t0 = time.perf_counter()
            model = self.embedder()
            model.embed(["warm-up"])
            loaded.append((f"query embedder {model.name} ({model.dim}-d)", time.perf_counter() - t0))
        if wanted & {"ingest", "audit"}:
            t0 = time.perf_counter()
            bind_once()
            loaded.append(("DuckDB's parameter binding", time.perf_counter() - t0))
        if "search" in wanted:
            t0 = time.perf_counter()
            compile_kernels()
            loaded.append(("the descent's compiled loops", time.perf_counter() - t0))
            t0 = time.perf_counter()
            vectors, st = self.index(), self.store()
            if vectors is None or st is None:
                what = f"no store in {self.settings().data_dir} yet (opened by the first query after one is published)"
            else:
                snap = self.snapshot()
                version = snap.version if snap is not None else 0
                postings = snap.postings() if snap is not None else None
                held = f" and full-text postings ({postings.nbytes / 2**20:,.1f} MiB)" if postings is not None else ""
                if snap is not None and snap.graph_part() is not None:
                    held += " and its graph"
                what = f"store version {version} with its vector index ({vectors.size:,} memories){held}"
            loaded.append((what, time.perf_counter() - t0))
        return loaded

    def forget_parent_connections(self) -> None:
        """In a forked child: the parent's DuckDB store connections are not ours
        to use or close; start without them (they are never touched again; the
        audit's, ``pipeline.audit.lake``, are dropped there)."""
        if self._reader is not None:
            self._inherited.append(self._reader)
        self._reader = None
        self._lock = threading.RLock()  # a thread of the parent may have held it at the fork


_PROCESS = Resources()


def current() -> Resources:
    """This process's resources (one instance per process; a forked child keeps
    it, without its parent's connections)."""
    return _PROCESS


def bind_once() -> None:
    """Bind one DuckDB parameter. The first bound parameter in a process
    imports pandas (if installed), to recognise pandas values: 0.2-0.4 s
    here, paid at warm-up instead of by the first write."""
    with duckdb.connect() as con:
        con.execute("SELECT ?", [1]).fetchall()


os.register_at_fork(after_in_child=lambda: _PROCESS.forget_parent_connections())
