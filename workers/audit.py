"""Sending audit rows off the query path.

On workers, ``search.budget`` sends each row to the ``audit`` queue, where
``audit.write`` (durable: acks late, rejected on worker loss, retried with
exponential backoff and jitter, idempotent by query id) writes it. Embedded,
a background thread runs the same task, so retrieval never waits for audit
either way; it is drained at exit.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading

from pipeline.audit import AuditRecord, build_record, log_line
from pipeline.contracts import Batch

from . import resources
from .app import app

search_log = logging.getLogger("dimple.search")

_queue: "queue.Queue[dict]" = queue.Queue()
_thread: threading.Thread | None = None
_lock = threading.Lock()


def emit(batch: Batch) -> None:
    """One ``hybrid.search`` INFO line per query (synchronous), then its row (asynchronous)."""
    settings = resources.settings()
    for state in batch.states:
        record = build_record(state, settings.rrf_k, settings.store_query_text)
        search_log.info(log_line(record))
        if settings.audit_enabled:
            send(record)


def send(record: AuditRecord) -> None:
    payload = record.model_dump(mode="json")
    if app.conf.task_always_eager:
        _ensure_thread()
        _queue.put(payload)
    else:
        from .tasks import audit_write

        audit_write.apply_async(args=[payload])


def _ensure_thread() -> None:
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="dimple-audit-writer", daemon=True)
            _thread.start()


def _run() -> None:
    from .tasks import audit_write

    while True:
        payload = _queue.get()
        try:
            audit_write.apply(args=[payload], throw=False)
        finally:
            _queue.task_done()


def flush(timeout: float = 30.0) -> bool:
    """Wait until every embedded audit row has been handled; False on timeout."""
    done = threading.Event()

    def waiter() -> None:
        _queue.join()
        done.set()

    threading.Thread(target=waiter, daemon=True).start()
    return done.wait(timeout)


atexit.register(flush, 10.0)
