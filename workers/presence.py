"""Which queues live workers consume, in one Redis read.

A write through the broker must fail at once, sending nothing, when no worker
consumes the ``ingest`` queue (an agent's ``remember`` would otherwise wait out
its whole timeout and then stay queued). Asking the workers (``inspect``)
waits a full second for their answers: too slow for every write. So each
worker, once ready, records itself in one sorted set per queue it consumes
(``dimple:consumers:<queue>``: member the worker's name, score the broker's
clock) every ``EVERY_S`` seconds, and takes itself out when it stops; a worker
that died without stopping ages out after ``TTL_S``. ``consumes(url, queue)``
reads that set: one round trip.

Only ``redis://`` and ``rediss://`` brokers are read (for others the answer is
None: unknown, and the caller asks the workers instead).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from celery import Celery, signals

log = logging.getLogger("dimple.worker")

EVERY_S = 2.0
TTL_S = 10.0  # five missed refreshes: a worker this silent is taken for gone
KEY = "dimple:consumers:{queue}"


def _redis(url: str) -> redis.Redis | None:
    if not url.startswith(("redis://", "rediss://")):
        return None
    return redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)


def _now(client: redis.Redis) -> float:
    seconds, micros = client.time()  # the broker's clock: hosts' clocks may differ
    return seconds + micros / 1e6


class _Clients:
    """One client per broker URL for this process (a forked child makes its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_url: dict[str, redis.Redis | None] = {}

    def get(self, url: str) -> redis.Redis | None:
        with self._lock:
            if url not in self._by_url:
                self._by_url[url] = _redis(url)
            return self._by_url[url]


_clients = _Clients()


def consumes(url: str, queue: str) -> bool | None:
    """Whether some live worker consumes ``queue`` on the broker at ``url``
    (None: a broker this module does not read). Redis' errors propagate."""
    client = _clients.get(url)
    if client is None:
        return None
    return client.zcount(KEY.format(queue=queue), _now(client) - TTL_S, "+inf") > 0


class Announcer:
    """A worker's presence: refreshed every ``EVERY_S`` from ``worker_ready``
    until the worker shuts down."""

    def __init__(self, url: str, name: str, queues: list[str]):
        self.name, self.queues = name, queues
        self._client = _redis(url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dimple-presence", daemon=True)

    def start(self) -> None:
        if self._client is not None:
            self._thread.start()

    def _run(self) -> None:
        assert self._client is not None
        while not self._stop.is_set():
            try:
                now = _now(self._client)
                pipe = self._client.pipeline(transaction=False)
                for queue in self.queues:
                    key = KEY.format(queue=queue)
                    pipe.zadd(key, {self.name: now})
                    pipe.zremrangebyscore(key, "-inf", now - TTL_S)  # the long gone
                pipe.execute()
            except (redis.RedisError, OSError) as exc:  # the broker is away: try again next round
                log.debug("presence refresh failed: %s", exc)
            self._stop.wait(EVERY_S)

    def stop(self) -> None:
        self._stop.set()
        if self._client is None:
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            for queue in self.queues:
                pipe.zrem(KEY.format(queue=queue), self.name)
            pipe.execute()
        except (redis.RedisError, OSError):
            pass  # ages out after TTL_S


_announcers: list[Announcer] = []  # this worker process's (one), kept for its shutdown


def _ready(sender: Any = None, **_: Any) -> None:
    """On ``worker_ready`` (``sender``: the worker's consumer): start announcing."""
    app = sender.app
    queues = sorted(app.amqp.queues.consume_from or app.amqp.queues)
    announcer = Announcer(app.conf.broker_url or "", sender.hostname, queues)
    announcer.start()
    _announcers.append(announcer)


def _shutting_down(**_: Any) -> None:
    while _announcers:
        _announcers.pop().stop()


def install(app: Celery) -> None:
    """Announce ``app``'s workers' queues while they run."""
    signals.worker_ready.connect(_ready, weak=False)
    signals.worker_shutting_down.connect(_shutting_down, weak=False)
    signals.worker_shutdown.connect(_shutting_down, weak=False)
