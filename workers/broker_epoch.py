"""Whether the broker lost its data since a message was sent.

A Redis broker that restarts without persistence (or is flushed) loses every
queued message, every unacknowledged one and every stored result: the
queries in flight then can never be answered, and their callers would wait
out their whole timeout. The broker's *epoch* tells: a random token stored
once under ``KEY`` (``SET NX``, no expiry) and read back. A caller notes the
epoch when it sends a canvas and compares while it waits; a different or
missing token means the data the canvas lived in is gone (``StageLostError``).
A broker restarted *with* its data (AOF or RDB persistence) keeps the token,
so its queries go on and are answered.

Limits: a broker whose eviction policy may evict keys without a TTL
(``allkeys-*``) could drop the token and make in-flight queries fail as lost;
dimple's compose file and ``ops.stack`` run Redis with ``noeviction``.
Only ``redis://`` and ``rediss://`` URLs are checked (others: no epoch, the
caller waits for its timeout as before).
"""

from __future__ import annotations

import threading
import time
import uuid

import redis

KEY = "dimple:broker-epoch"
# A waiting caller reads the epoch at most this often per broker, however many queries wait.
CHECK_EVERY_S = 0.5


def redis_client(url: str) -> redis.Redis | None:
    """A client for the Redis broker at ``url`` (None: not a ``redis://`` or ``rediss://`` URL)."""
    if not url.startswith(("redis://", "rediss://")):
        return None
    return redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)


class Epochs:
    """The brokers' epochs as this process last read them, and a client per broker URL."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, redis.Redis] = {}
        self._seen: dict[str, tuple[float, str | None]] = {}  # url -> (monotonic time read, epoch)

    def client(self, url: str) -> redis.Redis | None:
        """This process's client for the broker at ``url`` (``redis_client``), made once."""
        with self._lock:
            client = self._clients.get(url)
            if client is None:
                client = redis_client(url)
                if client is not None:
                    self._clients[url] = client
            return client

    def current(self, url: str) -> str | None:
        """The broker's epoch, set now if it has none (a first use, or a broker
        that lost its data). Raises redis' ``ConnectionError`` when unreachable;
        None for a broker this module does not check."""
        client = self.client(url)
        if client is None:
            return None
        pipe = client.pipeline(transaction=False)
        pipe.set(KEY, uuid.uuid4().hex, nx=True)
        pipe.get(KEY)
        _, value = pipe.execute()
        epoch = value.decode() if isinstance(value, bytes) else value
        with self._lock:
            self._seen[url] = (time.monotonic(), epoch)
        return epoch

    def lost_since(self, url: str, epoch: str | None) -> bool:
        """True when the broker's data is no longer the data of ``epoch`` (read at
        most every ``CHECK_EVERY_S``). An unreachable broker is not (yet) known to
        have lost anything: False."""
        if epoch is None:
            return False
        with self._lock:
            read_at, known = self._seen.get(url, (float("-inf"), None))
        if time.monotonic() - read_at >= CHECK_EVERY_S:
            try:
                known = self.current(url)
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                return False
        return known != epoch

    def forget(self) -> None:
        """Drop cached clients (tests, a reconfigured process)."""
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
            self._seen.clear()


_PROCESS = Epochs()


def epochs() -> Epochs:
    """This process's ``Epochs`` (every waiting caller shares its reads)."""
    return _PROCESS
