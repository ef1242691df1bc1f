"""The Celery app: JSON only, one route per queue, eager when no broker is set.

``celery -A workers.app worker -Q embed,search`` starts a worker; with no
``DIMPLE_BROKER_URL`` the same tasks run in-process (the embedded default).

Importing this module builds nothing: ``get_app()`` builds the process's app
(``build_app``) and installs the JSON-only guard on the broker's queue items,
once, at its first call (the worker's start, the API's first call). Celery's
``-A workers.app`` finds it as this module's ``app`` attribute (``__getattr__``).
"""

from __future__ import annotations

import atexit
import threading

from celery import Celery
from celery.apps.worker import Worker as CeleryWorker

from pipeline.errors import StageError

from . import audit, resources, tasks, upkeep
from .celery_compat import guard_queue_items, reset_connections, stop_waiting_at_exit, tell_senders_of_refused
from .leases import install as install_leases
from .presence import install as install_presence
from .settings import WorkerSettings, mask_url
from .warmup import install as install_warmup

QUEUES = ("embed", "search", "audit", "ingest")
# The command that starts a worker for each queue (the README's "Running on workers").
START_WORKER = {
    "embed": "dimple worker --queues embed",
    "search": "dimple worker --queues search --concurrency 2",
    "audit": "dimple worker --queues audit --concurrency 1",
    "ingest": "dimple worker --queues ingest --concurrency 2",
}
# How long a consumer check waits for workers' answers (each answers in milliseconds
# unless it is still starting: it answers once it has logged its ready line).
CONSUMER_CHECK_S = 1.0

ROUTES = {
    "search.embed": {"queue": "embed"},
    "search.*": {"queue": "search"},
    "audit.*": {"queue": "audit"},
    "ingest.*": {"queue": "ingest"},
    "store.get": {"queue": "search"},
}


def conf_for(settings: WorkerSettings) -> dict:
    """Celery configuration derived from dimple's settings."""
    broker = settings.broker_url.get_secret_value()
    return dict(
        broker_url=broker or "memory://",
        result_backend=settings.effective_result_backend or "cache+memory://",
        task_always_eager=not broker,
        task_eager_propagates=True,
        # JSON on the wire only: a message in any other serialisation is refused.
        task_serializer="json",
        result_serializer="json",
        event_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_routes=ROUTES,
        task_default_queue="search",
        # Redelivery on worker loss; tasks are idempotent (pure stages over a batch).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=settings.worker_prefetch_multiplier,
        # A pool process loads its queues' resources before it reports up
        # (workers/warmup.py); Celery's default of 4 s would kill a slower one.
        worker_proc_alive_timeout=settings.worker_warmup_timeout_s,
        task_soft_time_limit=settings.task_soft_time_limit_s,
        task_time_limit=settings.task_time_limit_s,
        # A live worker renews the lease on every message it holds (workers/leases.py);
        # a lost worker's messages come back after the visibility timeout. Every
        # worker sweeps for them each second (kombu's default is ~100 s); the sweep's
        # lock outlives a sweeper killed while holding it by a few seconds only.
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
            "unacked_mutex_expire": max(1, min(5, settings.visibility_timeout_s // 2)),
        },
        result_backend_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        result_expires=24 * 3600,
        # Intermediate stages ignore their results (workers/tasks.py); a failure
        # is still stored, so the caller's parent check sees a failed stage.
        task_store_errors_even_if_ignored=True,
        broker_connection_retry_on_startup=True,
        # Flower sees every stage with its arguments and runtime.
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
        # dimple logs through its own stderr handler (workers/cli/common.py setup_logging); Celery's
        # stdout/stderr proxies would feed that handler back into logging (a worker hung at start)
        worker_redirect_stdouts=False,
    )


def consumed_queues(timeout: float = CONSUMER_CHECK_S) -> set[str]:
    """The queues some live worker consumes now: asks every worker through
    the broker and waits ``timeout`` s for answers. Kombu's errors (broker
    down) propagate."""
    replies = get_app().control.inspect(timeout=timeout).active_queues() or {}
    return {queue["name"] for queues in replies.values() for queue in queues or ()}


class _Worker(CeleryWorker):
    """Celery's worker, whose start-up banner names the broker as ``dimple
    config`` does: kombu's ``Connection.as_uri`` writes a masked password
    (``redis://:**@host``) even for a broker that has none."""

    def startup_info(self, artlines: bool = True) -> str:
        text = super().startup_info(artlines)
        return text.replace(self.app.connection().as_uri(), mask_url(self.app.conf.broker_url or ""), 1)


def build_app(settings: WorkerSettings) -> Celery:
    """A Celery app for ``settings`` with dimple's tasks (``workers.tasks``) and
    its worker steps: the warm-up, the lease renewal, the audit outbox drain."""
    app = Celery("dimple")
    app.conf.update(conf_for(settings))
    app.Worker = app.subclass_with_self(_Worker)
    tasks.register(app)
    install_warmup(app)
    install_presence(app)  # writes check for an ingest worker in one Redis read (workers/presence.py)
    install_leases(app)  # a lost worker's messages come back within the visibility timeout
    audit.install(app)
    upkeep.install(app)  # the lake's erase check in ingest workers (workers/upkeep.py)
    return app


class _ProcessApp:
    """This process's app, built once (``get_app``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.app: Celery | None = None


_PROCESS = _ProcessApp()


def get_app() -> Celery:
    """This process's app, built at the first call from the process's settings,
    with the JSON-only guard installed: a worker survives any item on its
    queues, and a refused message's sender learns it at once."""
    with _PROCESS.lock:
        if _PROCESS.app is None:
            app = build_app(resources.current().settings())
            guard_queue_items()
            tell_senders_of_refused(lambda task_id, task, reason: app.backend.mark_as_failure(
                task_id, StageError(f"task {task} {task_id} was not run: {reason}")))
            # Handles never collected (a timed-out or abandoned search_async) must not
            # unsubscribe from inside a half torn-down interpreter.
            atexit.register(stop_waiting_at_exit, app)
            _PROCESS.app = app
        return _PROCESS.app


def reconfigure(settings: WorkerSettings) -> None:
    """Point the process-wide app at another broker (or embedded) at run time.

    Drops Celery's cached connection pool and result backend so the next call
    uses the new URLs.
    """
    app = get_app()
    app.conf.update(conf_for(settings))
    reset_connections(app)


def __getattr__(name: str) -> Celery:
    """``app`` (and ``celery``, which Celery's ``-A`` also looks for): the process's app."""
    if name in ("app", "celery"):
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
