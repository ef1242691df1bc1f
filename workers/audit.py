"""Sending audit rows off the query path.

On workers, ``search.budget`` first keeps the batch's rows in the outbox
(``pipeline.audit.letters``: a file in the audit dir, before the answer goes
back); the process sends them, with its other rows of the last second
(``SEND_LINGER_S``), as one message to the ``audit`` queue, where ``audit.write`` (acks
late, rejected on worker loss, retried with exponential backoff and jitter,
idempotent by query id) writes them and removes their files. The audit worker
also writes, every second or so, the outbox files whose message has not done
so after ``DIMPLE_AUDIT_OUTBOX_AFTER_S`` (it was lost with Redis, or with a
killed worker): a row once answered is written whatever dies, and once. Embedded,
a background thread applies the same write, retry and give-up policy, so
retrieval never waits for audit either way. At exit the thread is drained;
rows it could not write in time go to the dead-letter folder, not away.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery import Celery, signals
from pydantic import ValidationError

from pipeline.audit.lake import log_of
from pipeline.audit.letters import (
    OUTBOX_NAME,
    dead_letter,
    drain_outbox,
    outbox_batch,
    outbox_done,
    outbox_id,
    outbox_put,
    outbox_rows,
    quarantine,
)
from pipeline.audit.record import AuditRecord, build_record, log_line, retrieval_settings
from pipeline.audit.writer import write_records
from pipeline.contracts import Batch
from pipeline.errors import AuditRetriesExhausted, AuditWriteError, problems

from . import resources
from .settings import WorkerSettings

search_log = logging.getLogger("dimple.search")
log = logging.getLogger("dimple.audit")

class _Unlogged(threading.local):
    on = False


_UNLOGGED = _Unlogged()


@contextmanager
def unlogged() -> Iterator[None]:
    """The queries this thread runs in process meanwhile write no audit row
    (an embedded replay of a logged query: ``api.replay_row``); the process's
    other threads, and its settings, are left as they are."""
    before, _UNLOGGED.on = _UNLOGGED.on, True
    try:
        yield
    finally:
        _UNLOGGED.on = before


def emit(app: Celery, batch: Batch) -> None:
    """One ``hybrid.search`` INFO line per query (synchronous), then the batch's
    rows as one asynchronous write (none while ``unlogged``)."""
    settings = resources.current().settings()
    logged = search_log.isEnabledFor(logging.INFO)
    rows = settings.audit_enabled and not _UNLOGGED.on
    if not (logged or rows):
        return  # no line to log, no row to write: nothing to build
    ran_with = retrieval_settings(settings)
    records = [build_record(state, settings.rrf_k, settings.store_query_text, settings=ran_with)
               for state in batch.states]
    if logged:
        for record in records:
            search_log.info(log_line(record))
    if rows and records:
        send(app, records)


def valid_records(settings: WorkerSettings, records: Any) -> tuple[list[AuditRecord], int]:
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


def backoff_s(settings: WorkerSettings, retries: int) -> float:
    """Exponential backoff with full jitter in [0.5, 1] of the step, capped."""
    step = min(settings.audit_backoff_max_s, settings.audit_backoff_base_s * 2.0**retries)
    return step * random.uniform(0.5, 1.0)


def give_up(settings: WorkerSettings, records: list[AuditRecord], exc: Exception, retries: int) -> AuditRetriesExhausted:
    """Keep the rows as dead letters, say so at ERROR (one line a batch: a
    batch is up to a thousand rows), and return the typed error to raise."""
    for record in records:
        dead_letter(settings.dead_letter_dir, record, str(exc))
    shown = ", ".join(r.query_id for r in records[:5]) + (f" and {len(records) - 5} more" if len(records) > 5 else "")
    log.error("audit.write gave up on %d row(s) (queries %s) after %d retries: %s (kept for 'dimple audit retry')",
              len(records), shown, retries, exc)
    ids = ", ".join(r.query_id for r in records)
    return AuditRetriesExhausted(f"queries {ids}: {exc}")


def send(app: Celery, records: list[AuditRecord]) -> None:
    settings = resources.current().settings()
    if app.conf.task_always_eager:  # in this process: the rows themselves, no message to encode
        _EMBEDDED.put(settings, records)
        return
    payload = [r.model_dump(mode="json") for r in records]
    try:
        name: str | None = outbox_put(settings.audit_outbox_dir, payload)
    except OSError as exc:  # a read-only audit dir: the message alone carries the rows
        name = None
        log.error("cannot keep audit rows in the outbox %s (%s): they depend on the broker alone",
                  settings.audit_outbox_dir, exc)
    _SENDER.add(app, settings, name, payload)


# -- on workers: one message a linger per process -------------------------------------
# A message per query cost the audit worker a Celery task and a lake
# transaction per query (ops.bench.audit --workers, demo keyword: the stack's
# CPU a query +75-87% with audit on; BENCHMARKS.md, Audit). A search process
# sends its rows as one ``audit.write`` a linger after the first of them,
# naming their outbox files; each file is kept before its answer goes back,
# so a process that dies before sending leaves its rows to the host's outbox
# drain (``DIMPLE_AUDIT_OUTBOX_AFTER_S``), as a lost message did.
SEND_LINGER_S = 1.0


class _Sender:
    """This process's audit rows answered and not yet sent, and the thread
    sending them (started again in a forked child, which never sends its
    parent's)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: list[tuple[Celery, WorkerSettings, str | None, list[dict]]] = []
        self.rows = 0
        self.waiting = threading.Event()  # set while rows are pending
        self.full = threading.Event()  # set once ``BATCH_ROWS`` are pending: no lingering
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()

    def add(self, app: Celery, settings: WorkerSettings, name: str | None, payload: list[dict]) -> None:
        with self.lock:
            if self.pid != os.getpid():
                self.pid, self.pending, self.rows, self.thread = os.getpid(), [], 0, None
            self.pending.append((app, settings, name, payload))
            self.rows += len(payload)
            self.waiting.set()
            if self.rows >= BATCH_ROWS:
                self.full.set()
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="dimple-audit-sender", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            self.waiting.wait()
            self.full.wait(SEND_LINGER_S)
            self.send_now()

    def send_now(self) -> None:
        """Send every pending row now: one message per app and outbox."""
        with self.lock:
            if self.pid != os.getpid():
                return
            taken, self.pending, self.rows = self.pending, [], 0
            self.waiting.clear()
            self.full.clear()
        groups: dict[tuple[int, Path], list[tuple[Celery, WorkerSettings, str | None, list[dict]]]] = {}
        for item in taken:
            groups.setdefault((id(item[0]), item[1].audit_outbox_dir), []).append(item)
        for items in groups.values():
            app, settings = items[-1][0], items[-1][1]
            # the rows no outbox file keeps first (``unkept``), then those the files keep
            items.sort(key=lambda item: item[2] is not None)
            rows = [row for _, _, _, payload in items for row in payload]
            names = [name for _, _, name, _ in items if name is not None]
            unkept = sum(len(payload) for _, _, name, payload in items if name is None)
            try:
                kept = {"outbox": names, "host": outbox_id(settings.audit_outbox_dir),
                        "unkept": unkept} if names else {}
                # by name: the task is registered in workers.tasks, routed to the audit queue
                app.send_task("audit.write", args=[rows], kwargs=kept)
            except Exception as exc:
                lost = sum(len(payload) for _, _, name, payload in items if name is None)
                if lost:
                    log.error("audit.write could not be sent (%s: %s); %d row(s) kept in no outbox are lost",
                              type(exc).__name__, exc, lost)
                if names:
                    log.warning("audit.write could not be sent (%s: %s); the audit worker writes the rows of "
                                "%d outbox file(s) from there", type(exc).__name__, exc, len(names))


_SENDER = _Sender()


def send_pending() -> None:
    """Send this process's pending audit rows now (a pool process ending)."""
    _SENDER.send_now()


def _names(outbox: object) -> list:
    """The outbox file names a message carries: a list (one message a linger), or one name (earlier dimple)."""
    if isinstance(outbox, list):
        return outbox
    return [] if outbox is None else [outbox]


def done(settings: WorkerSettings, outbox: object) -> None:
    """The rows of the outbox files ``outbox`` names (from a message) are in the log or dead-lettered."""
    for name in _names(outbox):
        outbox_done(settings.audit_outbox_dir, name)


# Rows an ``audit.write`` takes from its host's outbox besides its own, in the same transaction.
BATCH_ROWS = 1000

# An audit worker process commits at most one audit transaction this often: a
# message that comes sooner waits out the rest (``PACE.wait``), then takes with its
# own rows every file its host's search processes kept meanwhile
# (``batch_of``). A transaction costs tens of milliseconds whatever it holds
# (BENCHMARKS.md, Audit), so a host pays about one a second, not one per search
# process; the messages of the files it took then write nothing.
WRITE_EVERY_S = 1.0


class _Pace:
    """When this process last committed an audit transaction."""

    def __init__(self) -> None:
        self.last = float("-inf")

    def wait(self) -> None:
        rest = self.last + WRITE_EVERY_S - time.monotonic()
        if rest > 0:
            time.sleep(rest)

    def wrote(self) -> None:
        self.last = time.monotonic()


PACE = _Pace()


def _ours(settings: WorkerSettings, names: list, host: object) -> bool:
    """Whether outbox files ``names`` are this host's (``host``, the outbox's id)."""
    if not names or not all(isinstance(n, str) and OUTBOX_NAME.match(n) for n in names) \
            or not isinstance(host, str):
        return False
    try:
        return host == outbox_id(settings.audit_outbox_dir)
    except OSError:
        return False


def written_with_another(settings: WorkerSettings, outbox: object, host: object) -> bool:
    """Whether a message's rows were already written by another message's
    batch (``batch_of``): its outbox files are this host's and all gone. A
    file goes only once its rows are in the log, dead-lettered or purged;
    another host's message is written as it comes."""
    names = _names(outbox)
    return _ours(settings, names, host) and not any((settings.audit_outbox_dir / n).exists() for n in names)


def message_rows(settings: WorkerSettings, records: Any, outbox: object, host: object,
                 unkept: object) -> tuple[Any, list[AuditRecord]]:
    """The rows an ``audit.write`` message writes, as its host keeps them now:
    (rows to validate, rows read from its outbox files). A message of this
    host's names the files keeping its rows after the ``unkept`` rows no file
    keeps: those files are read rather than the message, so rows ``dimple
    audit purge`` took from them (or a file it removed) are not written back
    by the message still on its way. Another host's message, or one sent
    before ``unkept`` was, is written as it comes."""
    names = _names(outbox)
    if not (isinstance(records, list) and isinstance(unkept, int) and 0 <= unkept <= len(records)
            and _ours(settings, names, host)):
        return records, []
    kept: list[AuditRecord] = []
    for name in names:
        kept.extend(outbox_rows(settings.audit_outbox_dir, settings.dead_letter_dir, name) or [])
    return records[:unkept], kept


def batch_of(settings: WorkerSettings, outbox: object) -> list[tuple[Path, list[AuditRecord]]]:
    """This host's other outbox files waiting now (up to ``BATCH_ROWS`` rows),
    written with a message's rows in one transaction: under a stream of
    queries the audit worker pays one transaction (one lake commit) per
    batch of waiting rows, not one per query; their own messages then find
    their files gone (``written_with_another``) and write nothing."""
    try:
        return outbox_batch(settings.audit_outbox_dir, settings.dead_letter_dir, BATCH_ROWS,
                            skip={n for n in _names(outbox) if isinstance(n, str)})
    except OSError:
        return []


# -- the outbox drain, in the audit worker's process ------------------------------------
def drain_once(settings: WorkerSettings, older_than_s: float) -> tuple[int, int]:
    """Write the outbox files at least ``older_than_s`` old; returns (files, rows inserted)."""
    return drain_outbox(settings.audit_outbox_dir, settings.dead_letter_dir,
                        lambda rows: write_records(log_of(settings), rows),
                        older_than_s=older_than_s)


class _Drainer:
    """This process's outbox drain: one thread, started once (again in a forked child)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        with self.lock:
            if self.thread is not None and self.thread.is_alive():
                return
            self.thread = threading.Thread(target=_drain_forever, name="dimple-audit-outbox", daemon=True)
            self.thread.start()


_DRAINER = _Drainer()


def start_drainer() -> None:
    """Start this process's outbox drain (once; again in a forked child)."""
    _DRAINER.start()


def _drain_forever() -> None:
    failing = False
    while True:
        try:
            settings = resources.current().settings()
        except Exception:  # e.g. a tuned row this dimple cannot read (every query says so too): try again
            if not failing:
                log.exception("the audit outbox drain cannot read its settings; trying again")
            failing = True
            time.sleep(1.0)
            continue
        after = settings.audit_outbox_after_s
        time.sleep(min(1.0, after / 2))
        try:
            files, rows = drain_once(settings, after)
        except AuditWriteError as exc:
            if not failing:
                log.warning("cannot write the audit outbox yet (%s); trying again", exc)
            failing = True
            continue
        except Exception:  # never let one bad file stop the drain
            log.exception("audit outbox drain failed")
            continue
        failing = False
        if files:
            log.info("wrote %d audit row(s) from %d outbox file(s) whose message had not (lost with the broker "
                     "or a worker)", rows, files)


def install(app: Celery) -> None:
    """Each pool process of ``app``'s workers that consume the audit queue
    drains the outbox; every worker process sends its pending rows as it ends."""

    def drain_in_audit_workers(**_: Any) -> None:
        if "audit" in (app.amqp.queues.consume_from or app.amqp.queues):  # queue names, as workers.warmup reads them
            start_drainer()

    def send_at_end(**_: Any) -> None:
        send_pending()

    signals.worker_process_init.connect(drain_in_audit_workers, weak=False)
    signals.worker_process_shutdown.connect(send_at_end, weak=False)  # a pool process
    signals.worker_shutdown.connect(send_at_end, weak=False)  # the worker (solo and threads pools run tasks there)


# -- embedded: a background thread writes the rows ----------------------------------------
# A write's transaction costs tens of milliseconds whatever it holds (DuckLake's
# metadata read and commit: 19-37 ms for 75 rows in a log of 400-2,000 commits,
# BENCHMARKS.md, Audit): the thread lingers this long after a row for the rows
# behind it and writes them together, so a stream of queries pays per batch,
# not per row. ``flush`` cuts the wait short; a row waits at most this long in
# memory (a SIGKILL loses it, as before).
EMBEDDED_LINGER_S = 1.0
EMBEDDED_MAX_ROWS = 1000


class _EmbeddedWriter:
    """The embedded audit rows waiting to be written, and the thread writing them."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[WorkerSettings, list[AuditRecord]]] = queue.Queue()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.hurry = threading.Event()  # set while someone waits in ``flush``: no lingering
        # what the thread took from the queue and has not handled yet (at exit, if it is stuck on it,
        # ``_drain_at_exit`` keeps it as dead letters: it is no longer in the queue)
        self.inflight: list[tuple[WorkerSettings, list[AuditRecord]]] = []

    def put(self, settings: WorkerSettings, records: list[AuditRecord]) -> None:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="dimple-audit-writer", daemon=True)
                self.thread.start()
        self.queue.put((settings, records))

    def _take(self) -> list[tuple[WorkerSettings, list[AuditRecord]]]:
        """The next item, and every one that arrived within the linger. The
        thread sleeps through the linger rather than waiting on the queue, so
        a query's ``put`` wakes no thread (each wake-up took the GIL from the
        queries); ``flush`` ends the sleep (``hurry``)."""
        items = [self.queue.get()]  # a ``flush`` wakes this wait with an empty item (``wake``)
        self.hurry.wait(EMBEDDED_LINGER_S)
        while True:
            try:
                items.append(self.queue.get_nowait())
            except queue.Empty:
                return items

    def wake(self) -> None:
        """End a linger now (``flush``): an item without rows, if the thread runs."""
        with self.lock:
            if self.thread is not None and self.thread.is_alive():
                self.queue.put((None, []))  # type: ignore[arg-type]

    def _run(self) -> None:
        while True:
            items = self.inflight = self._take()
            # one write per run of items bound for one audit store (settings change with ``configure``)
            groups: list[tuple[WorkerSettings, list[AuditRecord]]] = []
            for settings, records in items:
                if not records:  # a wake-up (``wake``), or a batch without rows
                    continue
                if groups and (groups[-1][0] is settings or log_of(groups[-1][0]) == log_of(settings)):
                    groups[-1][1].extend(records)
                else:
                    groups.append((settings, list(records)))
            for settings, records in groups:
                for start in range(0, len(records), EMBEDDED_MAX_ROWS):  # one transaction per so many rows
                    batch = records[start:start + EMBEDDED_MAX_ROWS]
                    try:
                        write_embedded(settings, batch)
                    except Exception:  # never let one row stop the writer
                        log.exception("embedded audit writer failed on a batch of %d row(s)", len(batch))
            self.inflight = []
            for _ in items:
                self.queue.task_done()


_EMBEDDED = _EmbeddedWriter()


class _Breaker:
    """After the embedded writer gave a batch up (its retries ran out: the
    audit store is down), the batches behind it are tried once, not retried,
    until one goes in: each would otherwise wait out the whole backoff
    (minutes at the defaults) while queries keep adding rows behind it, the
    queue growing in memory; tried once, they go to the dead letters as fast
    as they come, for ``dimple audit retry``."""

    def __init__(self) -> None:
        self.down: set = set()  # the audit logs (``LakeLog``) whose last batch was given up


_BREAKER = _Breaker()


def write_embedded(settings: WorkerSettings, records: list[AuditRecord]) -> int:
    """The embedded counterpart of ``audit.write``: same retries, same give-up
    (retries skipped while the store is known down: ``_Breaker``)."""
    target = log_of(settings)
    tries = 1 if target in _BREAKER.down else settings.audit_max_retries + 1
    for retries in range(tries):
        try:
            written = write_records(target, records)
        except AuditWriteError as exc:
            if retries == tries - 1:
                give_up(settings, records, exc, retries)
                _BREAKER.down.add(target)
                return 0
            time.sleep(backoff_s(settings, retries))
        else:
            _BREAKER.down.discard(target)
            return written
    return 0


def pending() -> bool:
    """Whether this process's embedded writer holds rows not yet written (queued or being written)."""
    return _EMBEDDED.queue.unfinished_tasks > 0


def flush(timeout: float = 30.0) -> bool:
    """Wait until every embedded audit row has been handled; False on timeout."""
    done = threading.Event()

    def waiter() -> None:
        _EMBEDDED.queue.join()
        done.set()

    _EMBEDDED.hurry.set()
    _EMBEDDED.wake()
    try:
        threading.Thread(target=waiter, daemon=True).start()
        finished = done.wait(timeout)
    finally:
        _EMBEDDED.hurry.clear()
    return finished


EXIT_FLUSH_S = 10.0  # how long an exiting process waits for its embedded rows to be written


def _drain_at_exit() -> None:
    if flush(EXIT_FLUSH_S):
        return
    # the writer is stuck (a broken audit store, its retries' pauses): the rows it holds and those
    # queued behind it are kept as dead letters (``dimple audit retry``; a row it writes after all
    # is written once: the retry skips what the log holds)
    held = list(_EMBEDDED.inflight)
    while True:
        try:
            held.append(_EMBEDDED.queue.get_nowait())
        except queue.Empty:
            break
        _EMBEDDED.queue.task_done()  # handled: kept below
    kept = 0
    for settings, records in held:
        for record in records:
            dead_letter(settings.dead_letter_dir, record, "process exited before the write")
            kept += 1
    if kept:
        log.error("%d audit row(s) not written before the process exited: kept as dead letters "
                  "(`dimple audit retry` writes them)", kept)


atexit.register(_drain_at_exit)
