"""Heavy per-process resources, loaded lazily once: the embedder, and the
read-only store (base, vector index and deltas, following each published write).

The module is this process's ``pipeline.stages.registry.Resources``:
``settings()``, ``embedder()`` and ``view()``. A worker loads
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
from pipeline.settings import Settings, get_settings
from pipeline.store.database import Store
from pipeline.store.reader import Reader, Snapshot, View
from pipeline.store.vector import VectorIndex, compile_kernels

_lock = threading.RLock()
_settings: Settings | None = None
_embedders: dict[bool, Embedder] = {}  # by bulk: the query embedder, the bulk (ingest) embedder
_reader: Reader | None = None
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


def reader() -> Reader:
    """This process's view of the published store (``pipeline.store.reader``)."""
    global _reader
    with _lock:
        if _reader is None:
            _reader = Reader(settings().data_dir, memory_limit=settings().query_memory_limit)
        return _reader


def snapshot() -> Snapshot | None:
    """The published base and deltas, or None when nothing was written yet.

    Follows every published write at the next task: a new delta is read and
    merged at once; a new base (after compaction) loads in the background
    while the old one answers.
    """
    return reader().snapshot()


def store() -> Store | None:
    """The published base, read-only (None when none exists yet)."""
    snap = snapshot()
    return snap.store if snap is not None else None


def index() -> VectorIndex | None:
    snap = snapshot()
    return snap.index() if snap is not None else None


@contextmanager
def view() -> Iterator[View | None]:
    """One published state for one stage of this thread (``Snapshot.view``),
    None when nothing was written yet."""
    snap = snapshot()
    if snap is None:
        yield None
        return
    with snap.view() as v:
        yield v


def close_store() -> None:
    """Release the store (another data dir, or shutdown)."""
    global _reader
    with _lock:
        if _reader is not None:
            _reader.close()
        _reader = None


def warm(queues: Iterable[str]) -> list[tuple[str, float]]:
    """Load now, in this process, what the tasks of ``queues`` use (routes in
    ``workers.app``): ``embed`` and ``ingest`` the query embedder (an agent's
    write embeds a few texts; a batch of more than ``embed_batch_size`` loads
    the bulk embedder at its first, ``writes._embedder_for``), ``ingest`` and
    ``audit`` what DuckDB loads at its first bound parameter, ``search`` the
    published store, its vector index and full-text postings (if a store is
    published yet). The embedder embeds one text, so nothing is left to load
    on the first task. Returns (what was loaded, seconds) pairs."""
    wanted = set(queues)
    loaded = []
    if wanted & {"embed", "ingest"}:
        t0 = time.perf_counter()
        model = embedder()
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
        vectors, st = index(), store()
        if vectors is None or st is None:
            what = f"no store in {settings().data_dir} yet (opened by the first query after one is published)"
        else:
            snap = snapshot()
            version = snap.version if snap is not None else 0
            postings = snap.postings() if snap is not None else None
            held = f" and full-text postings ({postings.nbytes / 2**20:,.1f} MiB)" if postings is not None else ""
            what = f"store version {version} with its vector index ({vectors.size:,} memories){held}"
        loaded.append((what, time.perf_counter() - t0))
    return loaded


def bind_once() -> None:
    """Bind one DuckDB parameter. The first bound parameter in a process
    imports pandas (if installed), to recognise pandas values: 0.2-0.4 s
    here, paid at warm-up instead of by the first write."""
    import duckdb

    with duckdb.connect() as con:
        con.execute("SELECT ?", [1]).fetchall()


def _forget_parent_connections() -> None:
    """In a forked child: the parent's DuckDB store and audit connections are
    not ours to use or close; start without them (they are never touched again)."""
    global _reader, _audit_writer, _lock
    _inherited.extend(x for x in (_reader, _audit_writer) if x is not None)
    _reader, _audit_writer = None, None
    _lock = threading.RLock()  # a thread of the parent may have held it at the fork


_inherited: list[Any] = []
os.register_at_fork(after_in_child=_forget_parent_connections)
