"""Every use of Celery's private attributes, in one place, for the Celery
minor version pyproject pins (``celery>=5.7,<5.8``);
``tests/unit/test_celery_compat.py`` fails when an upgrade moves any of them.

- ``reset_connections``: forget the app's cached broker pool and result
  backend (``_pool``, ``amqp._producer_pool``, ``_backend_cache``, ``_local``).
  Celery's result consumer gives up for good after a failed reconnect ("the
  application must be restarted"); this is that restart.
- ``ThrottledParentCheck``: ``AsyncResult._maybe_reraise_parent_error`` re-reads
  every parent stage's state after each message the result consumer gets;
  once per 50 ms is enough to notice a failed stage early.
- ``stop_waiting`` / ``stop_waiting_at_exit``: drop the result backend's
  waiters (``_pending_results``) and result subscriptions (the Redis result
  consumer's ``subscribed_to``) for a finished canvas, or for everything at
  interpreter exit. A chord's header parts ignore their results, so nothing
  ever resolves Celery's waiters on them: each query would stay subscribed for
  the life of the process, and at exit ``AsyncResult.__del__`` unsubscribes
  through a half torn-down redis client ("Exception ignored in ...
  AsyncResult.__del__ ... sys.meta_path is None").
- ``held_delivery_tags``: the delivery tags a Redis channel's QoS holds
  unacknowledged (kombu's ``QoS._delivered`` less ``QoS._dirty``, the tags
  acknowledged but not yet flushed), for the lease renewal (``workers.leases``).
- ``guard_queue_items``: kombu's Redis transport parses each queue item's
  envelope itself (``loads`` in ``Channel._brpop_read`` and ``Channel._get``,
  kombu 5.7); an item that is not one (``LPUSH search 'not json'``, a JSON
  list, an envelope without properties or with a body that is not base64)
  raised out of the worker's event loop and stopped the worker. Within those
  two methods, the item's own parse (the first ``loads`` of the call; the
  delivery that follows, a restore included, is kombu's as it was): items
  that are not a well-formed envelope become an envelope
  no task accepts, which Celery logs and deletes ("Received and deleted
  unknown message"); the item is logged at ERROR. Everywhere else (the
  restore of unacked messages) ``loads`` is kombu's own.
- ``canvas_classes`` / ``eager_tracer``: the classes ``chain(...)`` and
  ``chord(...)`` build (``celery.canvas._chain``, ``_chord``) and the tracer
  ``Task.apply`` runs a task with (``celery.app.trace.build_tracer``), for
  ``workers.canvas.run_eager``, which walks an embedded canvas and runs each
  stage through a tracer built once per task instead of once per call.
- ``tell_senders_of_refused``: a message Celery cannot decode (a pickle, a
  body that is not JSON) is logged and rejected (Celery's public
  ``task_rejected`` signal), and an item the guard refuses is dropped; in
  both cases its sender waited until its timeout. Where the item names a
  task id (``headers.id``), a failure naming the reason is stored for that
  id, so the sender's ``get()`` raises at once.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import kombu.transport.redis as transport
from celery import Celery, signals
from celery import canvas as celery_canvas
from celery.app import trace as celery_trace
from celery.backends.redis import RedisBackend, ResultConsumer
from celery.result import AsyncResult
from kombu.transport.virtual.base import QoS

log = logging.getLogger("dimple.queue")

# The private names this module relies on (checked by the test).
TRANSPORT_METHODS = ("_brpop_read", "_get")  # kombu.transport.redis.Channel; both call the module's ``loads``
APP_ATTRIBUTES = ("_pool", "_backend_cache", "_local")
RESULT_METHODS = ("_maybe_reraise_parent_error",)
BACKEND_ATTRIBUTES = ("_pending_results",)
RESULT_CONSUMER_ATTRIBUTES = ("subscribed_to",)  # the Redis result backend's consumer
QOS_ATTRIBUTES = ("_delivered", "_dirty")  # kombu.transport.virtual.QoS
CANVAS_CLASSES = ("_chain", "_chord")  # celery.canvas: what chain(...) and chord(...) build
TRACE_FUNCTIONS = ("build_tracer",)  # celery.app.trace: what Task.apply runs a task with


def canvas_classes() -> tuple[Any, Any]:
    """``celery.canvas``'s chain and chord classes (what ``workers.canvas.run_eager`` walks)."""
    return celery_canvas._chain, celery_canvas._chord


def eager_tracer(app: Celery, name: str) -> Any:
    """Celery's tracer of task ``name`` as ``Task.apply`` builds it under
    ``task_eager_propagates``: eager, a task's exception raised to the caller."""
    return celery_trace.build_tracer(name, app.tasks[name], eager=True, propagate=True, app=app)


def reset_connections(app: Celery) -> None:
    """Forget cached broker pools and the result backend; the next call reconnects."""
    app._pool = None
    if "amqp" in app.__dict__:
        app.amqp._producer_pool = None
    old = app._backend_cache or getattr(app._local, "backend", None)
    if old is not None:
        # Results still holding the abandoned backend unsubscribe through it
        # when garbage-collected; with its connection gone that would raise
        # inside __del__. They need nothing from it any more.
        old.remove_pending_result = lambda *args, **kwargs: None
    app._backend_cache = None
    app._local = threading.local()


class ThrottledParentCheck:
    """Mixin for an ``AsyncResult``: parent states are re-read at most every ``parent_check_s``."""

    parent_check_s = 0.05
    _parents_checked = float("-inf")

    def _maybe_reraise_parent_error(self) -> None:
        now = time.monotonic()
        if now - self._parents_checked < self.parent_check_s:
            return
        self._parents_checked = now
        super()._maybe_reraise_parent_error()  # type: ignore[misc]


def held_delivery_tags(qos: Any) -> list[str]:
    """The delivery tags ``qos`` (a kombu virtual/Redis QoS) holds unacknowledged.

    Called from the lease thread while the event loop changes the mapping: a
    dict copy is atomic under the GIL, and a copy that races a resize is
    simply taken again."""
    for _ in range(5):
        try:
            delivered, dirty = dict(qos._delivered), set(qos._dirty)
            break
        except RuntimeError:  # changed size during the copy
            continue
    else:
        return []
    return [tag for tag in delivered if tag not in dirty]


def canvas_ids(result: Any) -> Iterator[str]:
    """The task ids of a canvas's result and of everything it follows: its
    parents and, for a chord, the header group's results."""
    stack = [result]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        yield node.id
        stack.extend(getattr(node, "results", None) or ())
        stack.append(getattr(node, "parent", None))


def stop_waiting(result: Any) -> None:
    """Forget every waiter the result backend keeps for ``result``'s canvas
    and unsubscribe from their results (one unsubscribe per id still subscribed).

    Call it once nothing more is expected: ``get()`` returned or raised for
    good, or the caller gave up. A later ``get()`` on the same handle waits
    afresh."""
    backend = result.backend
    ids = set(canvas_ids(result))
    for mapping in backend._pending_results:
        for task_id in ids:
            mapping.pop(task_id, None)
    consumer = getattr(backend, "result_consumer", None)
    if consumer is not None:
        for task_id in ids:
            consumer.cancel_for(task_id)


def waiting_on(backend: Any) -> set[str]:
    """Task ids the backend still keeps waiters or a result subscription for."""
    ids = {task_id for mapping in backend._pending_results for task_id in mapping}
    subscribed = getattr(getattr(backend, "result_consumer", None), "subscribed_to", None) or ()
    prefix = _text(getattr(backend, "task_keyprefix", ""))
    return ids | {_text(key).removeprefix(prefix) for key in subscribed}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def stop_waiting_at_exit(app: Celery) -> None:
    """For ``atexit``: forget every waiter and subscription of this thread's
    result backend without a network call (the connection closes with the
    process), so results collected during interpreter shutdown have nothing
    to unsubscribe."""
    backend = app._backend_cache or getattr(app._local, "backend", None)
    if backend is None:
        return
    for mapping in backend._pending_results:
        mapping.clear()
    subscribed = getattr(getattr(backend, "result_consumer", None), "subscribed_to", None)
    if subscribed is not None:
        subscribed.clear()


def has_private_api() -> dict[str, bool]:
    """Which of the private names this module uses the installed Celery has."""
    app: Any = Celery("probe", set_as_current=False)
    found = {f"Celery.{a}": hasattr(app, a) or a in type(app).__dict__ for a in APP_ATTRIBUTES}
    found |= {f"AsyncResult.{m}": callable(getattr(AsyncResult, m, None)) for m in RESULT_METHODS}
    backend = RedisBackend(app=app, url="redis://127.0.0.1:1/0")  # connects lazily: nothing is reached
    found |= {f"RedisBackend.{a}": hasattr(backend, a) for a in BACKEND_ATTRIBUTES}
    found |= {f"ResultConsumer.{a}": hasattr(backend.result_consumer, a) for a in RESULT_CONSUMER_ATTRIBUTES}
    found["ResultConsumer.cancel_for"] = callable(getattr(ResultConsumer, "cancel_for", None))
    qos = QoS(SimpleNamespace(do_restore=False))  # its bookkeeping only; nothing to restore at exit
    found |= {f"QoS.{a}": hasattr(qos, a) for a in QOS_ATTRIBUTES}
    for name in ("unacked_index_key", "visibility_timeout", "conn_or_acquire"):
        found[f"redis.Channel.{name}"] = hasattr(transport.Channel, name)
    found |= {f"redis.Channel.{m}": callable(getattr(transport.Channel, m, None)) for m in TRANSPORT_METHODS}
    found["redis.loads"] = callable(getattr(transport, "loads", None))
    found |= {f"celery.canvas.{c}": isinstance(getattr(celery_canvas, c, None), type) for c in CANVAS_CLASSES}
    found |= {f"celery.app.trace.{f}": callable(getattr(celery_trace, f, None)) for f in TRACE_FUNCTIONS}

    return found


# -- queue items that are not messages ------------------------------------------------
# set while kombu reads one queue item: armed for that item's own parse only
_READING: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar("dimple_reading_queue_item", default=None)


def _envelope_problem(payload: Any) -> str | None:
    """Why ``payload`` is not a kombu message envelope kombu can deliver (None when it is)."""
    if not isinstance(payload, dict):
        return f"a JSON {type(payload).__name__}, not an envelope"
    props = payload.get("properties")
    if not isinstance(props, dict) or not isinstance(props.get("delivery_tag"), str):
        return "no properties.delivery_tag"
    info = props.get("delivery_info", {})
    if not isinstance(info, dict):
        return "delivery_info is not an object"
    headers = payload.get("headers")
    if headers is not None and not isinstance(headers, dict):
        return "headers is not an object"
    body = payload.get("body")
    if body is not None and not isinstance(body, str):
        return "body is not a string"
    for key in ("content-type", "content-encoding"):
        if payload.get(key) is not None and not isinstance(payload.get(key), str):
            return f"{key} is not a string"
    encoding = props.get("body_encoding")
    if encoding not in (None, "base64"):
        return f"unknown body_encoding {encoding!r}"
    if encoding == "base64" and body:
        try:
            base64.b64decode(body.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            return "body is not base64"
    return None


# called with (task id, task name, reason) for a refused item that names its task id
_on_refused: list[Any] = []


def _task_of(payload: Any) -> tuple[str, str] | None:
    """(task id, task name) named by an item's headers, if it names one."""
    headers = payload.get("headers") if isinstance(payload, dict) else None
    if isinstance(headers, dict) and isinstance(headers.get("id"), str) and headers["id"]:
        return headers["id"], str(headers.get("task", "?"))
    return None


def _tell_sender(payload: Any, reason: str) -> None:
    task = _task_of(payload)
    if task is None:
        return
    for callback in _on_refused:
        try:
            callback(*task, reason)
        except Exception as exc:  # noqa: BLE001 - the result backend away: the sender waits, as before
            log.warning("could not tell the sender of refused task %s: %s", task[0], exc)


def _refused(problem: str, text: Any, payload: Any = None) -> dict:
    shown = text if isinstance(text, str) else repr(text)
    log.error("a queue item that is not a message was refused (%s): %.200r", problem, shown)
    _tell_sender(payload, f"the worker refused it: {problem}")
    return {"body": "", "content-type": "application/json", "content-encoding": "utf-8", "headers": {},
            "properties": {"delivery_tag": str(uuid.uuid4()), "delivery_info": {"exchange": "", "routing_key": ""},
                           "priority": 0, "body_encoding": None}}


def tell_senders_of_refused(on_refused: Any) -> None:
    """Call ``on_refused(task_id, task_name, reason)`` for every refused item
    or message Celery rejects as invalid (its ``task_rejected`` signal: a
    pickle, a body that is not JSON) that names its task id. Idempotent."""
    if on_refused in _on_refused:
        return
    _on_refused.append(on_refused)
    if len(_on_refused) == 1:
        signals.task_rejected.connect(_on_task_rejected, weak=False)


def _on_task_rejected(sender: Any = None, message: Any = None, exc: Any = None, **_: Any) -> None:
    _tell_sender({"headers": getattr(message, "headers", None)},
                 f"the worker could not decode it ({type(exc).__name__}: {exc}); messages are JSON only")


def guard_queue_items() -> None:
    """Make workers survive any item on a Redis queue (see the module docstring). Idempotent."""
    if getattr(transport.loads, "_dimple_guard", False):
        return
    original_loads = transport.loads

    def loads(text: Any, *args: Any, **kwargs: Any) -> Any:
        armed = _READING.get()
        if not armed or not armed[0]:
            return original_loads(text, *args, **kwargs)
        armed[0] = False  # only the item itself: what the delivery then does (a restore) is kombu's
        try:
            payload = original_loads(text, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any parse failure is a refused item
            return _refused(f"not JSON: {type(exc).__name__}", text)
        problem = _envelope_problem(payload)
        return payload if problem is None else _refused(problem, text, payload)

    loads._dimple_guard = True  # type: ignore[attr-defined]
    transport.loads = loads  # type: ignore[assignment]
    for name in TRANSPORT_METHODS:
        method = getattr(transport.Channel, name)

        def reading(self: Any, *args: Any, _method: Any = method, **kwargs: Any) -> Any:
            token = _READING.set([True])
            try:
                return _method(self, *args, **kwargs)
            finally:
                _READING.reset(token)

        setattr(transport.Channel, name, reading)
