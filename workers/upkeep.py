"""The lake's upkeep in the processes that write it:
a thread that asks, every ``erase.check_every`` (a minute at the default
``store.erase_within`` of an hour), whether a forget waits to be erased
(``Follower.erase_due``: one small catalog read), and when one does sends
``ingest.compact`` (docs/LAKE.md, "Forget means erased"); and deletes this
host's cache folders of bases compaction dropped (``Follower.clear_cache``:
after an erase they hold erased memories' vectors and terms), however quiet
the host's search processes are.

Why here: a forget's bytes must go within ``store.erase_within`` even when
nothing is written after it, and every write already checks (``compact_due``);
what is left is a store that falls quiet. The ingest workers are the
processes that compact; one read a minute each costs nothing beside the
search processes' ten polls a second, and keeps the check out of the query
path. Started in every pool process that consumes ``ingest``
(``worker_process_init``: a prefork pool's children, and the worker's own
process with celery's solo pool, which sends it there too), in the worker's
own process with a threads pool (which sends none: at ``worker_ready``), and
at the first write of a process (an embedded one, where the task runs in
the caller's process and compacts there). Once per process, whichever comes
first. In the worker's own process the check compacts itself rather than
sending ``ingest.compact`` (see ``_Upkeep.compacts_here``).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from datetime import datetime, timedelta
from typing import Any

from celery import Celery, signals
from celery.concurrency.prefork import TaskPool as PreforkPool

from pipeline.errors import StoreError
from pipeline.store.database import utcnow
from pipeline.store.lake import erase as erasing
from pipeline.store.maintenance import compact

from . import resources

log = logging.getLogger("dimple.worker")


class _Upkeep:
    """This process's check: one thread, started once (again in a forked child)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        # the worker's own process (solo, threads pool: set at worker_ready): it
        # compacts in the check's thread instead of sending ingest.compact (it is
        # the ingest worker: a message would come back to this process anyway)
        self.compacts_here = False

    def start(self, app: Celery) -> None:
        with self.lock:
            if self.thread is not None and self.thread.is_alive():
                return
            self.stop.clear()
            self.thread = threading.Thread(target=self._run, args=(app,), name="dimple-lake-upkeep", daemon=True)
            self.thread.start()

    def _run(self, app: Celery) -> None:
        while True:
            try:
                every = erasing.check_every(resources.current().settings().store.erase_within).total_seconds()
            except Exception:  # e.g. a tuned row this dimple cannot read (every query says so too)
                log.exception("the lake's erase check cannot read its settings; trying again in a minute")
                every = 60.0
            if self.stop.wait(every):
                return
            try:
                check(app, here=self.compacts_here)
            except StoreError as exc:  # says what to do (e.g. files to delete by hand): no traceback each minute
                log.error("the lake's erase check failed: %s", exc)
            except Exception:  # never let one failed check stop the next
                log.exception("the lake's erase check failed")

    def end(self) -> None:
        """Stop the thread, after the check or compaction it is in (DuckDB aborts
        a process that exits while a thread is inside a query)."""
        self.stop.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


_UPKEEP = _Upkeep()
atexit.register(_UPKEEP.end)


def check(app: Celery, *, here: bool = False) -> bool:
    """When an erase is due, send ``ingest.compact`` (``here``: compact in this
    thread, what that task would do); whether one was due."""
    settings = resources.current().settings()
    if not settings.data_dir.exists():
        return False  # nothing written here (and nothing to create by asking)
    try:
        follower = resources.current().reader().lake
    except StoreError as exc:  # e.g. a segment store not migrated yet: nothing on the lake to erase
        _refused(str(exc))  # every command says so, with what to run; the check says it once
        return False
    if follower is not None:  # the host cache's folders of bases compaction dropped, on any host
        follower.clear_cache()  # type: ignore[attr-defined]
    state = follower.erase_state() if follower is not None else None  # type: ignore[attr-defined]
    now = utcnow()
    erase_within = settings.store.erase_within
    due = state is not None and erasing.due(state.oldest, erase_within, now, state.held_until)
    if state is not None and state.oldest is not None and now - state.oldest > erase_within:
        _overdue(state, now - state.oldest, now, erase_within)
    if due:
        log.info("a forget is due to be erased (store.erase_within): compacting the lake")
        if here:
            compact(settings)
        else:
            app.tasks["ingest.compact"].apply_async(kwargs={"when_due": True})
    return due


_SAID: set[str] = set()
# how often a process says that the erase is overdue (each check that finds it so would be every minute)
OVERDUE_EVERY = timedelta(minutes=10)
_overdue_said = [float("-inf")]


def _overdue(state: erasing.EraseState, age: timedelta, now: datetime, erase_within: timedelta) -> None:
    """Say at WARNING, every ``OVERDUE_EVERY`` at most, that a forget is older
    than ``store.erase_within``: the bound is broken (a compaction failing, or
    waiting for files the dead left), and only the logs and ``dimple stats`` show it."""
    said = time.monotonic()
    if said < _overdue_said[0] + OVERDUE_EVERY.total_seconds():
        return
    _overdue_said[0] = said
    if state.held_until is None:
        why = "the compactions that should erase it have not (see their errors)"
    elif now < state.held_until:
        why = f"the erase waits for files a compaction or a write that died left, until {state.held_until:%Y-%m-%d %H:%M:%S} UTC"
    else:
        why = (f"its wait for files a compaction or a write that died left ended at {state.held_until:%Y-%m-%d %H:%M:%S} "
               "UTC, and the compactions since have not erased it (see their errors)")
    log.warning("store.erase_within broken: %d forget(s) wait to be erased, the oldest for %s (the bound is %s): %s; "
                "'dimple stats' shows them", state.waiting, str(age).split(".")[0], erase_within, why)


def _refused(why: str) -> None:
    """A store this process cannot open, said once per reason (not a failed check each minute)."""
    if why not in _SAID:
        _SAID.add(why)
        log.warning("the lake's erase check skips this store: %s", why)


def start(app: Celery) -> None:
    """Start this process's erase check (once)."""
    _UPKEEP.start(app)


def stop() -> None:
    """Stop this process's check (after the one it is in); ``start`` starts it again."""
    _UPKEEP.end()


def install(app: Celery) -> None:
    """Each process of ``app``'s workers that runs ingest tasks checks: every
    pool process of a prefork pool (``worker_process_init``, in the child),
    and the worker's own process for a pool that runs tasks there (solo sends
    ``worker_process_init`` there; threads sends none, so ``worker_ready``,
    sent once, starts it too). A prefork pool's parent runs no task and forks
    new children: it does not check (nor attach the lake)."""

    def consumes_ingest() -> bool:
        return "ingest" in (app.amqp.queues.consume_from or app.amqp.queues)  # as workers.audit.install reads them

    def check_in_pool_process(**_: Any) -> None:
        _UPKEEP.compacts_here = False  # a prefork child forked after worker_ready inherits True
        if consumes_ingest():
            start(app)

    def check_in_worker_process(sender: Any = None, **_: Any) -> None:
        if consumes_ingest() and not isinstance(getattr(sender, "pool", None), PreforkPool):
            _UPKEEP.compacts_here = True  # solo's check, started at worker_process_init, too
            start(app)

    signals.worker_process_init.connect(check_in_pool_process, weak=False)
    signals.worker_ready.connect(check_in_worker_process, weak=False)
