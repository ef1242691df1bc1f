"""The lake's upkeep in the processes that write it (``store.engine = lake``):
a thread that asks, every ``erase.check_every`` (a minute at the default
``store.erase_within`` of an hour), whether a forget waits to be erased
(``Follower.erase_due``: one small catalog read), and when one does sends
``ingest.compact`` (docs/LAKE.md, "Forget means erased").

Why here: a forget's bytes must go within ``store.erase_within`` even when
nothing is written after it, and every write already checks (``compact_due``);
what is left is a store that falls quiet. The ingest workers are the
processes that compact; one read a minute each costs nothing beside the
search processes' ten polls a second, and keeps the check out of the query
path. Started in every pool process that consumes ``ingest`` and at the first
write of a process (an embedded one, where the task runs in the caller's
process and compacts there; a solo or threads pool).
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

from celery import Celery, signals

from pipeline.store.lake import erase as erasing

from . import resources

log = logging.getLogger("dimple.worker")


class _Upkeep:
    """This process's check: one thread, started once (again in a forked child)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()

    def start(self, app: Celery) -> None:
        if resources.current().settings().store.engine != "lake":
            return
        with self.lock:
            if self.thread is not None and self.thread.is_alive():
                return
            self.stop.clear()
            self.thread = threading.Thread(target=self._run, args=(app,), name="dimple-lake-upkeep", daemon=True)
            self.thread.start()

    def _run(self, app: Celery) -> None:
        while True:
            settings = resources.current().settings()
            if self.stop.wait(erasing.check_every(settings.store.erase_within).total_seconds()):
                return
            try:
                check(app)
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


def check(app: Celery) -> bool:
    """Send ``ingest.compact`` when an erase is due; whether it did."""
    if not resources.current().settings().data_dir.exists():
        return False  # nothing written here (and nothing to create by asking)
    follower = resources.current().reader().lake
    due = bool(follower is not None and follower.erase_due(fresh=True))  # type: ignore[attr-defined]
    if due:
        log.info("a forget is due to be erased (store.erase_within): compacting the lake")
        app.tasks["ingest.compact"].apply_async()
    return due


def start(app: Celery) -> None:
    """Start this process's erase check (once; only with ``store.engine = lake``)."""
    _UPKEEP.start(app)


def install(app: Celery) -> None:
    """Each pool process of ``app``'s workers that consume the ingest queue checks."""

    def check_in_ingest_workers(**_: Any) -> None:
        if "ingest" in (app.amqp.queues.consume_from or app.amqp.queues):  # as workers.audit.install reads them
            start(app)

    signals.worker_process_init.connect(check_in_ingest_workers, weak=False)
