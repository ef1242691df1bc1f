"""Leases on the messages a worker holds: a lost worker's messages come back
within ``DIMPLE_VISIBILITY_TIMEOUT_S``, however long a live worker's tasks run.

Kombu's Redis transport keeps each delivered, unacknowledged message in the
``unacked`` hash with its delivery time in the ``unacked_index`` sorted set;
every worker sweeps that index (``unacked_restore_interval``) and puts back on
its queue any message delivered more than ``visibility_timeout`` seconds ago.
Alone, that forces a choice: a short timeout re-runs a long task while it
still runs, a long one (the old default, an hour) leaves a killed worker's
messages, a query's stages and audit rows among them, invisible for that long.

``RenewLeases`` is a consumer bootstep that removes the choice: a thread of
the worker's main process re-stamps, every ``visibility_timeout / 5``
seconds, the delivery time of every message this worker still holds (running,
reserved, or waiting for its ETA; ``ZADD XX``, so an acknowledged message is
never put back). A live worker's messages are therefore never older than one
renewal; a worker whose main process died (SIGKILL, OOM, a lost host) stops
renewing, and its messages are put back on their queues by any other worker
within ``visibility_timeout`` plus one sweep.

What it does not cover: a message taken off the queue (BRPOP) but not yet
recorded in ``unacked`` when the worker died (kombu's own window: from Redis'
reply until the main process reads it, usually well under a millisecond,
longer under load; ``tests/slow/test_lake_kill.py`` once killed a worker in it);
a worker that cannot reach Redis for longer than the timeout (its messages are
then also run elsewhere: every task is idempotent); Redis itself losing its
data (``workers.broker_epoch``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import Celery, bootsteps

from .celery_compat import held_delivery_tags

log = logging.getLogger("dimple.worker")


def renew_interval_s(visibility_timeout_s: float) -> float:
    """How often a worker re-stamps its messages: five times per timeout."""
    return max(0.2, visibility_timeout_s / 5.0)


def renew(channel: Any, now: float | None = None) -> int:
    """Re-stamp the delivery time of every message ``channel`` holds (one
    ``ZADD XX``: a message acknowledged meanwhile stays out); returns how many
    this worker holds."""
    tags = held_delivery_tags(channel.qos)
    if not tags:
        return 0
    stamp = time.time() if now is None else now
    with channel.conn_or_acquire() as client:
        client.zadd(channel.unacked_index_key, dict.fromkeys(tags, stamp), xx=True)
    return len(tags)


class RenewLeases(bootsteps.StartStopStep):
    """Renew this worker's leases while its task consumer runs (restarted
    with the consumer after a broker reconnect, on the new channel)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)
    label = "dimple leases"

    def __init__(self, c: Any, **kwargs: Any):
        super().__init__(c, **kwargs)
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, c: Any) -> None:
        channel = getattr(getattr(c, "task_consumer", None), "channel", None)
        if channel is None or not hasattr(channel, "unacked_index_key"):  # not Redis: nothing to renew
            return
        interval = renew_interval_s(float(channel.visibility_timeout))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(channel, interval, self._stop),
                                        name="dimple-lease-renewer", daemon=True)
        self._thread.start()

    def stop(self, c: Any) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._stop = self._thread = None

    shutdown = stop

    @staticmethod
    def _run(channel: Any, interval: float, stop: threading.Event) -> None:
        failing = False
        while not stop.wait(interval):
            try:
                renew(channel)
            except Exception as exc:  # noqa: BLE001 - the broker is away; the consumer reconnects on its own
                if not failing:
                    log.warning("could not renew the leases of held messages (%s: %s); if this lasts longer "
                                "than DIMPLE_VISIBILITY_TIMEOUT_S other workers run them too",
                                type(exc).__name__, exc)
                failing = True
                continue
            if failing:
                log.info("lease renewal works again")
            failing = False


def install(app: Celery) -> None:
    """Add the lease renewal to ``app``'s workers."""
    app.steps["consumer"].add(RenewLeases)
