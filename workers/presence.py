"""Which queues live workers consume, in one Redis read.

A write through the broker must fail at once, sending nothing, when no worker
consumes the ``ingest`` queue (an agent's ``remember`` would otherwise wait out
its whole timeout and then stay queued). Asking the workers (``inspect``)
waits a full second for their answers: too slow for every write. So each
worker, once ready, records itself in one sorted set per queue it consumes
(``dimple:consumers:<queue>``: member the worker's name, score the broker's
clock) every ``EVERY_S`` seconds, and takes itself out when it stops; a worker
that died without stopping ages out after ``TTL_S``. ``consumes(url, queue)``
reads that set (the broker's clock, then a count: two small commands).

Only ``redis://`` and ``rediss://`` brokers are read (for others the answer is
None: unknown, and the caller asks the workers instead).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery, signals

from .broker_epoch import epochs, redis_client

log = logging.getLogger("dimple.worker")

EVERY_S = 2.0
TTL_S = 10.0  # five missed refreshes: a worker this silent is taken for gone
KEY = "dimple:consumers:{queue}"


def _now(client: redis.Redis) -> float:
    seconds, micros = client.time()  # the broker's clock: hosts' clocks may differ
    return seconds + micros / 1e6


def consumes(url: str, queue: str) -> bool | None:
    """Whether some live worker consumes ``queue`` on the broker at ``url``
    (None: a broker this module does not read). Redis' errors propagate."""
    client = epochs().client(url)  # the caller's one client per broker
    if client is None:
        return None
    return client.zcount(KEY.format(queue=queue), _now(client) - TTL_S, "+inf") > 0


class Announcer:
    """A worker's presence: the queues its consumer takes from, refreshed every
    ``EVERY_S`` from ``worker_ready`` until the worker shuts down (a queue
    whose consumer was cancelled, ``celery control cancel_consumer``, leaves
    at the next refresh)."""

    def __init__(self, url: str, name: str, queues: Callable[[], list[str]]):
        self.name, self.queues = name, queues
        self._client = redis_client(url)  # its own: a worker thread's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dimple-presence", daemon=True)
        self._announced: set[str] = set()

    def start(self) -> None:
        if self._client is not None:
            self._thread.start()

    def _run(self) -> None:
        assert self._client is not None
        while not self._stop.is_set():
            try:
                now = _now(self._client)
                queues = set(self.queues())
                pipe = self._client.pipeline(transaction=False)
                for queue in queues:
                    key = KEY.format(queue=queue)
                    pipe.zadd(key, {self.name: now})
                    pipe.zremrangebyscore(key, "-inf", now - TTL_S)  # the long gone
                for queue in self._announced - queues:
                    pipe.zrem(KEY.format(queue=queue), self.name)
                pipe.execute()
                self._announced = queues
            except (redis.RedisError, OSError) as exc:  # the broker is away: try again next round
                log.debug("presence refresh failed: %s", exc)
            self._stop.wait(EVERY_S)

    def stop(self) -> None:
        self._stop.set()
        if self._client is None:
            return
        if self._thread.is_alive():
            self._thread.join(timeout=3)  # a refresh under way would announce again after the removal
        try:
            pipe = self._client.pipeline(transaction=False)
            for queue in self._announced:
                pipe.zrem(KEY.format(queue=queue), self.name)
            pipe.execute()
        except (redis.RedisError, OSError):
            pass  # ages out after TTL_S


class _Announcers:
    """This worker process's announcer (one), kept for its shutdown."""

    def __init__(self) -> None:
        self.running: list[Announcer] = []

    def ready(self, sender: Any = None, **_: Any) -> None:
        """On ``worker_ready`` (``sender``: the worker's consumer): start announcing."""
        app = sender.app

        def queues() -> list[str]:
            consumer = getattr(sender, "task_consumer", None)
            if consumer is None:  # not consuming yet (or any more)
                return []
            return sorted(q.name for q in consumer.queues)

        announcer = Announcer(app.conf.broker_url or "", sender.hostname, queues)
        announcer.start()
        self.running.append(announcer)

    def stop(self, **_: Any) -> None:
        while self.running:
            self.running.pop().stop()


_ANNOUNCERS = _Announcers()


def install(app: Celery) -> None:
    """Announce ``app``'s workers' queues while they run."""
    signals.worker_ready.connect(_ANNOUNCERS.ready, weak=False)
    signals.worker_shutting_down.connect(_ANNOUNCERS.stop, weak=False)
    signals.worker_shutdown.connect(_ANNOUNCERS.stop, weak=False)
