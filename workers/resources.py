"""Heavy per-process resources, loaded lazily once: the embedder, the read-only
store and the vector index (reloaded when the store's generation changes).

The module is this process's ``pipeline.stages.registry.Resources``:
``settings()``, ``embedder()``, ``index()`` and ``cursor()``. A worker loads
what its queues need up front (``warm``); a forked child never inherits its
parent's DuckDB connections.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.audit.writer import AuditWriter
from pipeline.embedders import Embedder, make_embedder
from pipeline.errors import StoreError
from pipeline.settings import Settings, get_settings
from pipeline.stages.descend import VectorIndex
from pipeline.store import generations
from pipeline.store.database import Store

_lock = threading.RLock()
_settings: Settings | None = None
_embedders: dict[bool, Embedder] = {}  # by bulk: the query embedder, the ingest embedder
_store: Store | None = None
_index: VectorIndex | None = None
_audit_writer: AuditWriter | None = None


def configure(settings: Settings) -> None:
    """Use ``settings`` from now on.

    The open store is kept unless the data dir changes; the model is kept
    unless the model or device changes.
    """
    global _settings
    with _lock:
        previous = _settings
        if previous is not None and (
            settings.embedding_model != previous.embedding_model
            or settings.embedding_device != previous.embedding_device
        ):
            _embedders.clear()
        _settings = settings
        if previous is None or previous.data_dir != settings.data_dir:
            close_store()


def settings() -> Settings:
    global _settings
    with _lock:
        if _settings is None:
            _settings = get_settings()
        return _settings


def embedder(bulk: bool = False) -> Embedder:
    """This process's embedder for queries, or (``bulk``) for ingest (``make_embedder``)."""
    with _lock:
        if bulk not in _embedders:
            _embedders[bulk] = make_embedder(settings(), bulk=bulk)
        return _embedders[bulk]


def audit_writer() -> AuditWriter:
    """This process's audit writer (its connection held open between writes, bounded)."""
    global _audit_writer
    with _lock:
        s = settings()
        idle_s, max_hold_s = s.audit_hold_idle_ms / 1000.0, s.audit_hold_max_ms / 1000.0
        if _audit_writer is None:
            _audit_writer = AuditWriter(idle_s=idle_s, max_hold_s=max_hold_s)
        _audit_writer.idle_s, _audit_writer.max_hold_s = idle_s, max_hold_s
        return _audit_writer


def release_audit() -> None:
    """Close the audit writer's connection, if it holds one."""
    if _audit_writer is not None:
        _audit_writer.release()


atexit.register(release_audit)


def store() -> Store | None:
    """The published store generation, read-only, or None when none exists yet.

    Switches to a newer generation as soon as one is published, so an
    acknowledged ingest is visible to the next task without a restart.
    """
    global _store, _index
    with _lock:
        for _ in range(5):
            path = generations.current(settings().data_dir)
            if path is None:
                return None
            if _store is not None and _store.path == path:
                return _store
            try:
                fresh = Store.open(path, read_only=True)
            except StoreError:
                if path.exists():
                    raise
                continue  # deleted between reading CURRENT and opening: read CURRENT again
            # DuckDB would otherwise keep the blocks the index load read
            # (1.5 GB at 1M memories) cached beside the numpy copy
            fresh.con.execute("SET memory_limit = ?", [settings().query_memory_limit])
            if _store is not None:
                _store.close()
            _store, _index = fresh, None
            return _store
        raise StoreError(f"the store in {settings().data_dir} kept changing while opening it")


def index() -> VectorIndex | None:
    global _index
    with _lock:
        st = store()
        if st is None:
            return None
        generation = st.generation
        if _index is None or _index.generation != generation:
            _index = VectorIndex.load(st.con, generation, st.info.embedding_dim)
        return _index


@contextmanager
def cursor() -> Iterator[Any]:
    """A cursor for this thread on the read-only store (None when none is
    published yet), closed on exit."""
    st = store()
    cur = st.cursor() if st is not None else None
    try:
        yield cur
    finally:
        if cur is not None:
            cur.close()


def close_store() -> None:
    """Release the store (before this process writes to it, or on shutdown)."""
    global _store, _index
    with _lock:
        if _store is not None:
            _store.close()
        _store = None
        _index = None


def warm(queues: Iterable[str]) -> list[tuple[str, float]]:
    """Load now, in this process, what the tasks of ``queues`` use (routes in
    ``workers.app``): ``embed`` the query embedder, ``ingest`` the ingest
    embedder, ``search`` the published store and its vector index (if a store
    is published yet). Each embedder embeds one text, so nothing is left to
    load on the first task. Returns (what was loaded, seconds) pairs."""
    wanted = set(queues)
    loaded = []
    for queue, bulk, role in (("embed", False, "query"), ("ingest", True, "ingest")):
        if queue in wanted:
            t0 = time.perf_counter()
            model = embedder(bulk=bulk)
            model.embed(["warm-up"])
            loaded.append((f"{role} embedder {model.name} ({model.dim}-d)", time.perf_counter() - t0))
    if "search" in wanted:
        t0 = time.perf_counter()
        vectors, st = index(), store()
        if vectors is None or st is None:
            what = f"no store in {settings().data_dir} yet (opened by the first query after one is published)"
        else:
            what = f"store generation {st.generation} with its vector index ({vectors.size:,} memories)"
        loaded.append((what, time.perf_counter() - t0))
    return loaded


def _forget_parent_connections() -> None:
    """In a forked child: the parent's DuckDB store and audit connections are
    not ours to use or close; start without them (they are never touched again)."""
    global _store, _index, _audit_writer, _lock
    _inherited.extend(x for x in (_store, _audit_writer) if x is not None)
    _store, _index, _audit_writer = None, None, None
    _lock = threading.RLock()  # a thread of the parent may have held it at the fork


_inherited: list[Any] = []
os.register_at_fork(after_in_child=_forget_parent_connections)
