"""Sending audit rows off the query path.

On workers, ``search.budget`` sends each row to the ``audit`` queue, where
``audit.write`` (durable: acks late, rejected on worker loss, retried with
exponential backoff and jitter, idempotent by query id) writes it. Embedded,
a background thread applies the same write, retry and give-up policy, so
retrieval never waits for audit either way. At exit the thread is drained;
rows it could not write in time go to the dead-letter folder, not away.
"""

from __future__ import annotations

import atexit
import logging
import queue
import random
import threading
import time
from typing import Any

from pydantic import ValidationError

from pipeline.audit.letters import dead_letter, quarantine
from pipeline.audit.record import AuditRecord, build_record, log_line
from pipeline.contracts import Batch
from pipeline.errors import AuditRetriesExhausted, AuditWriteError, problems
from pipeline.settings import Settings

from . import resources
from .app import app

search_log = logging.getLogger("dimple.search")
log = logging.getLogger("dimple.audit")

_queue: queue.Queue[tuple[Settings, list[dict]]] = queue.Queue()
_thread: threading.Thread | None = None
_lock = threading.Lock()


def emit(batch: Batch) -> None:
    """One ``hybrid.search`` INFO line per query (synchronous), then the batch's
    rows as one asynchronous write."""
    settings = resources.settings()
    records = [build_record(state, settings.rrf_k, settings.store_query_text) for state in batch.states]
    for record in records:
        search_log.info(log_line(record))
    if settings.audit_enabled and records:
        send(records)


def valid_records(settings: Settings, records: Any) -> tuple[list[AuditRecord], int]:
    """The rows of an ``audit.write`` message that can be written, each
    validated on its own; a malformed one is quarantined with the field named
    and logged at ERROR, and the rest are written. Returns (rows, refused)."""
    if not isinstance(records, list):
        records = [records]
    rows, refused = [], 0
    for record in records:
        try:
            rows.append(AuditRecord.model_validate(record))
        except ValidationError as exc:
            where, msg, _ = problems(exc, "record")[0]
            path = quarantine(settings.dead_letter_dir, record, f"{where}: {msg}")
            log.error("audit.write refused a malformed row (%s: %s); kept in %s", where, msg, path)
            refused += 1
    return rows, refused


def backoff_s(settings: Settings, retries: int) -> float:
    """Exponential backoff with full jitter in [0.5, 1] of the step, capped."""
    step = min(settings.audit_backoff_max_s, settings.audit_backoff_base_s * 2.0**retries)
    return step * random.uniform(0.5, 1.0)


def give_up(settings: Settings, records: list[AuditRecord], exc: Exception, retries: int) -> AuditRetriesExhausted:
    """Keep the rows as dead letters, say so at ERROR, and return the typed error to raise."""
    for record in records:
        dead_letter(settings.dead_letter_dir, record, str(exc))
        log.error(
            "audit.write gave up on query %s after %d retries: %s (kept for 'dimple audit retry')",
            record.query_id, retries, exc,
        )
    ids = ", ".join(r.query_id for r in records)
    return AuditRetriesExhausted(f"queries {ids}: {exc}")


def send(records: list[AuditRecord]) -> None:
    payload = [r.model_dump(mode="json") for r in records]
    if app.conf.task_always_eager:
        _ensure_thread()
        _queue.put((resources.settings(), payload))
    else:
        # by name: the task is registered in workers.tasks, routed to the audit queue
        app.send_task("audit.write", args=[payload])


def _ensure_thread() -> None:
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="dimple-audit-writer", daemon=True)
            _thread.start()


def _run() -> None:
    while True:
        settings, payload = _queue.get()
        try:
            write_embedded(settings, [AuditRecord.model_validate(p) for p in payload])
        except Exception:  # never let one row stop the writer
            log.exception("embedded audit writer failed on a row")
        finally:
            _queue.task_done()


def write_embedded(settings: Settings, records: list[AuditRecord]) -> int:
    """The embedded counterpart of ``audit.write``: same retries, same give-up."""
    for retries in range(settings.audit_max_retries + 1):
        try:
            return resources.audit_writer().write(settings.audit_path, records)
        except AuditWriteError as exc:
            if retries == settings.audit_max_retries:
                give_up(settings, records, exc, retries)
                return 0
            time.sleep(backoff_s(settings, retries))
    return 0


def flush(timeout: float = 30.0) -> bool:
    """Wait until every embedded audit row has been handled; False on timeout."""
    done = threading.Event()

    def waiter() -> None:
        _queue.join()
        done.set()

    threading.Thread(target=waiter, daemon=True).start()
    finished = done.wait(timeout)
    if finished:
        resources.release_audit()  # written rows are on disk and the file is free for others
    return finished


def _drain_at_exit() -> None:
    if flush(10.0):
        return
    while True:  # the writer is stuck (e.g. a broken audit store): keep the rest as dead letters
        try:
            settings, payload = _queue.get_nowait()
        except queue.Empty:
            return
        for p in payload:
            dead_letter(settings.dead_letter_dir, AuditRecord.model_validate(p), "process exited before the write")


atexit.register(_drain_at_exit)
