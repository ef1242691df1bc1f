"""The Python API: ``search``, ``search_async`` and ``search_many``; the
writes ``remember``, ``forget`` (each with an ``_async`` form) and ``get``;
the audit trail's ``explain`` (why each result of a logged query was served)
and ``explain_miss`` (why a memory was not among them).

Embedded (no broker configured) the canvas runs in-process; with
``DIMPLE_BROKER_URL`` set the same canvas runs on workers and
``search_async`` returns an ``AsyncResult`` whose ``get()`` gives ``Results``.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

from celery import states
from celery.exceptions import ChordError, TaskRevokedError
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult, EagerResult
from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError

from pipeline import audit
from pipeline.audit.explain import diff_served, replay_options, store_changed
from pipeline.audit.record import AuditRecord
from pipeline.audit.whynot import WhyNot, why_not
from pipeline.contracts import Batch, QueryOptions, Results, id_problem, make_query, text_problem
from pipeline.errors import (
    BrokerUnavailableError,
    DimpleError,
    IngestTimeoutError,
    IngestValidationError,
    InputError,
    LineError,
    NoWorkerError,
    QueryTimeoutError,
    StageError,
    StageLostError,
)
from pipeline.store.writes import WriteResult, parse_records, record_lines

from . import broker_epoch, presence, resources
from .app import CONSUMER_CHECK_S, START_WORKER, consumed_queues, get_app
from .audit import flush as flush_audit
from .audit import pending as audit_pending
from .audit import unlogged
from .canvas import query_canvas, run_eager
from .celery_compat import ThrottledParentCheck, reset_connections, stop_waiting
from .tasks import HandedOn, get_task

# Celery reports a result backend it cannot reconnect to as a RuntimeError.
BROKER_DOWN = (OperationalError, RedisConnectionError, RuntimeError)


def _decode(value: Any) -> list[Results]:
    batch = value.batch if isinstance(value, HandedOn) else Batch.model_validate(value)
    return [Results.from_state(s) for s in batch.states]


# While a caller waits, it looks this often whether the broker lost the query (broker_epoch).
WAIT_STEP_S = 1.0


class _Lost(Exception):
    """The broker lost what a handle waits for (raised by ``_wait``, reworded by its caller)."""


def _wait(fetch: Callable[..., Any], timeout: float | None, lost: Callable[[], bool],
          abandoned: Callable[[], bool] = lambda: False, **kwargs: Any) -> Any:
    """``fetch(timeout=...)`` (an ``AsyncResult.get``) in steps of ``WAIT_STEP_S``,
    looking before each whether the broker lost the task (``_Lost``); Celery's
    ``TimeoutError`` once ``timeout`` has passed, or once ``abandoned()`` says
    no answer can come (asked after each step without one)."""
    due = None if timeout is None else time.monotonic() + timeout
    while True:
        if lost():  # known at once once any waiter of this process saw it
            raise _Lost
        step = WAIT_STEP_S if due is None else min(WAIT_STEP_S, max(due - time.monotonic(), 0.01))
        try:
            return fetch(timeout=step, **kwargs)
        except CeleryTimeoutError:
            if (due is not None and time.monotonic() >= due) or abandoned():
                raise


# how Celery's result backend words a chord whose header part failed (``_unpack_chord_result``)
_DEPENDENCY = re.compile(r"Dependency (\S+) raised ")


def _part_error(app: Any, exc: Exception) -> DimpleError | None:
    """The typed error a leg raised, where its chord reports it as a
    ``ChordError`` naming the part (a hybrid query's two legs run as one):
    read back from the part's stored failure, as a chain's caller gets an
    earlier stage's own. None when there is none to read."""
    found = _DEPENDENCY.match(str(exc)) if isinstance(exc, ChordError) else None
    if found is None:
        return None
    try:
        part = AsyncResult(found.group(1), app=app).result
    except Exception:  # noqa: BLE001 - the chord's own error is reported then
        return None
    return part if isinstance(part, DimpleError) else None


def _expired(exc: Exception) -> bool:
    """A stage discarded at the query's deadline (Celery reports it revoked;
    a chord whose part was discarded fails with a ChordError naming it)."""
    return isinstance(exc, TaskRevokedError) or (isinstance(exc, ChordError) and "TaskRevokedError" in str(exc))


class _WaitIsGet:
    """``wait()`` is this handle's ``get()``: Celery's ``wait`` is its own
    ``get``, bound before a subclass's."""

    def wait(self, *args: Any, **kwargs: Any):
        return self.get(*args, **kwargs)  # type: ignore[attr-defined]


class _DecodesResults(_WaitIsGet):
    """``get()`` returns ``Results`` (one query) or ``list[Results]`` (a batch).

    A timeout raises ``QueryTimeoutError``, a lost broker ``BrokerUnavailableError``,
    a broker that lost the query's stages (restarted without its data)
    ``StageLostError`` as soon as that is seen (within about a second), each
    naming the task and how long after sending it happened.

    Once ``get()`` has an answer or a stage's error, the handle stops waiting
    on the canvas (``release``); after a timeout it keeps waiting, so ``get()``
    may be called again, until ``release()``.
    """

    single = True
    id: str  # from AsyncResult / EagerResult
    sent_at: float | None = None  # monotonic time the canvas was sent
    deadline: float | None = None  # monotonic time its stages expire (DIMPLE_TASK_TIMEOUT_S after sending)
    queues: tuple[str, ...] = ("embed", "search")  # the queues its canvas uses (no embed: keyword)

    def get(self, timeout: float | None = None, **kwargs: Any):
        try:
            value = _wait(super().get, timeout, self._lost, self._abandoned, **kwargs)  # type: ignore[misc]
        except _Lost:
            self.release()
            raise StageLostError(
                f"task {self.id} was lost {self._since()}: the broker restarted without its data "
                "(or was flushed), so its queued stages and results are gone; send the query again") from None
        except BROKER_DOWN as exc:
            reset_connections(get_app())  # abandons the backend, its waiters with it
            raise BrokerUnavailableError(
                f"lost the broker or result backend while waiting for task {self.id}: {exc}") from None
        except CeleryTimeoutError:  # still waiting: get() may be called again
            raise QueryTimeoutError(f"no answer for task {self.id} {self._since(timeout)}; "
                                    f"{_why_no_answer(self.queues)}") from None
        except DimpleError:
            self.release()
            raise
        except Exception as exc:  # a stage raised on a worker: Celery rebuilt its error
            self.release()
            if _expired(exc):
                raise QueryTimeoutError(
                    f"task {self.id}: its stages expired unrun at the query's deadline "
                    "(DIMPLE_TASK_TIMEOUT_S after sending)") from None
            typed = _part_error(get_app(), exc)
            if typed is not None:
                raise typed from None
            raise StageError(f"a pipeline stage failed on a worker: {type(exc).__name__}: {exc}") from None
        self.release()
        results = _decode(value)
        return results[0] if self.single else results

    def _since(self, timeout: float | None = None) -> str:
        if self.sent_at is not None:
            return f"within {time.monotonic() - self.sent_at:.1f} s of sending it"
        return f"within {timeout} s"

    def _lost(self) -> bool:
        """Whether the broker lost this canvas (never, embedded)."""
        return False

    def _abandoned(self) -> bool:
        """Whether no answer can come: past the deadline, and no worker consumes
        the queue of the canvas's last stages (``search``). Those were never
        run, and a worker started later discards them unrun (they expire at the
        deadline), so a ``get()`` with no timeout (or one past the deadline)
        ends then with ``QueryTimeoutError`` naming the queue, not waiting
        forever. (The ``embed`` queue alone tells nothing: its stage may have
        run before its worker went.) Never, embedded."""
        if self.deadline is None or time.monotonic() < self.deadline:
            return False
        return self.queues[-1] in _unconsumed(self.queues)[0]

    def release(self) -> None:
        """Stop waiting on this query's canvas; nothing to do embedded."""




class _ConsumerCheck:
    """The last answer to which queues live workers consume: (broker, when, queues)."""

    def __init__(self) -> None:
        self.last: tuple[str, float, set[str]] = ("", float("-inf"), set())


_CONSUMERS = _ConsumerCheck()


def _ask_consumers() -> set[str]:
    """``consumed_queues``, asked once more when the first ask failed within
    its own wait for answers (plus as much again for the broker's round trips):
    a broker hiccup. A broker that stays down fails the second ask as fast.
    CI once saw the first ask fail against a live redis-server, error unknown."""
    t0 = time.monotonic()
    try:
        return consumed_queues()
    except BROKER_DOWN:
        if time.monotonic() - t0 >= 2 * CONSUMER_CHECK_S:
            raise
    return consumed_queues()


def _unconsumed(queues: tuple[str, ...]) -> tuple[list[str], str]:
    """(which of ``queues`` no live worker consumes, why none could be named:
    asking failed), asked once per few seconds however many waiters ask.
    Only after a wait without an answer: an answered query never pays for it."""
    app = get_app()
    broker, checked_at, consumed = _CONSUMERS.last
    if broker != app.conf.broker_url or time.monotonic() - checked_at > 5 * CONSUMER_CHECK_S:
        try:
            consumed = _ask_consumers()
        except BROKER_DOWN as exc:
            return [], f"{type(exc).__name__}: {exc}"
        _CONSUMERS.last = (app.conf.broker_url, time.monotonic(), consumed)
    return [q for q in queues if q not in consumed], ""


def _why_no_answer(queues: tuple[str, ...]) -> str:
    """After a timeout: which of the query's queues no worker consumes."""
    missing, failed = _unconsumed(queues)
    if failed:
        return f"are workers running for the {' and '.join(queues)} queues? (asking them failed: {failed})"
    if missing:
        return (f"no worker is consuming the {' and '.join(repr(q) for q in missing)} queue"
                f"{'s' if len(missing) > 1 else ''}; start: {'; '.join(START_WORKER[q] for q in missing)}")
    return (f"workers consume the {' and '.join(queues)} queues but none answered in time "
            "(busy with other batches, or a stage is stuck: see their logs or Flower)")


class SearchAsyncResult(_DecodesResults, ThrottledParentCheck, AsyncResult):
    """An ``AsyncResult`` for a query canvas running on workers."""

    broker: str = ""
    epoch: str | None = None  # the broker's epoch when the canvas was sent (broker_epoch)

    def _lost(self) -> bool:
        return broker_epoch.epochs().lost_since(self.broker, self.epoch)

    def release(self) -> None:
        """Stop waiting on this query's canvas: Celery would otherwise keep
        waiting, for the life of the process, on the chord's header parts
        (their results are ignored, so none ever arrives)."""
        stop_waiting(self)


class EagerSearchResult(_DecodesResults, EagerResult):
    """The embedded counterpart: already done when returned. Its last stage
    handed its batch on in this process (``tasks.HandedOn``): ``get()``
    decodes that batch itself, and Celery's ``result`` and ``info`` give its
    JSON, as the handle of a query on workers does."""

    @property
    def result(self) -> Any:
        value = self._result
        return value.batch.model_dump(mode="json") if isinstance(value, HandedOn) else value

    info = result

    def _get_task_meta(self) -> dict:
        return {**self._cache, "result": self.result}

    def get(self, timeout: float | None = None, **kwargs: Any):
        if not isinstance(self._result, HandedOn):  # e.g. revoked: Celery's answer
            return super().get(timeout, **kwargs)
        results = _decode(self._result)
        return results[0] if self.single else results


def _batch(items: Iterable[tuple[str, Any]]) -> Batch:
    settings = resources.current().settings()
    states = []
    for text, options in items:
        states.append({"query": make_query(text, options, settings).model_dump(mode="json")})
    if len(states) > settings.limits.max_batch_queries:
        raise InputError("queries", f"{len(states)} queries, over the limit of {settings.limits.max_batch_queries}")
    return Batch.model_validate({"states": states})


def _dispatch(model: Batch, single: bool):
    """Send one canvas. On workers its stages carry the query's deadline
    (``DIMPLE_TASK_TIMEOUT_S`` from now) as their expiry: a stage still queued
    then (its caller gave up, or its worker was lost and it came back late) is
    discarded unrun, audit row included. A batch that needs no embedding
    (keyword) does not wait on the ``embed`` queue."""
    batch, embed, legs = model.model_dump(mode="json"), model.needs_embedding(), model.legs()
    app = get_app()
    if app.conf.task_always_eager:
        cid = str(uuid4())
        out = EagerSearchResult(cid, run_eager(app, query_canvas(app, batch, canvas_id=cid, embed=embed, legs=legs)),
                                states.SUCCESS)
    else:
        budget = resources.current().settings().task_timeout_s
        expires = (datetime.now(UTC) + timedelta(seconds=budget)).isoformat()
        broker = app.conf.broker_url
        try:
            epoch = broker_epoch.epochs().current(broker)
            sent_at = time.monotonic()
            res = query_canvas(app, batch, expires=expires, embed=embed, legs=legs).apply_async()
        except (*BROKER_DOWN, broker_epoch.redis.RedisError) as exc:
            reset_connections(app)
            raise BrokerUnavailableError(f"cannot reach the broker or result backend: {exc}") from None
        out = SearchAsyncResult(res.id, app=app, parent=res.parent)
        out.broker, out.epoch, out.sent_at, out.deadline = broker, epoch, sent_at, sent_at + budget
    out.single = single
    out.queues = ("embed", "search") if embed else ("search",)
    return out


def search_async(query: str, **options: Any) -> SearchAsyncResult | EagerSearchResult:
    """Start one query; ``.get(timeout=...)`` returns its ``Results``.

    Bad input raises ``InputError`` naming the field before anything is sent.
    On workers its stages expire ``DIMPLE_TASK_TIMEOUT_S`` after sending: one
    still queued then is discarded unrun (a later ``get()`` says so), and a
    ``get()`` still waiting then, with no worker consuming the ``search``
    queue, raises ``QueryTimeoutError`` naming it rather than wait forever.
    """
    return _dispatch(_batch([(query, options)]), single=True)


def search(query: str, **options: Any) -> Results:
    """Run one query and return its ``Results``."""
    handle = search_async(query, **options)
    try:
        return handle.get(timeout=resources.current().settings().task_timeout_s)
    except QueryTimeoutError:
        handle.release()
        raise


def _split(item: Any, where: str) -> tuple[Any, Any]:
    """(text, options) of one query of a batch (``where``: ``queries[i]``)."""
    if isinstance(item, str):
        return item, None
    if isinstance(item, dict):
        item = dict(item)
        if "query" in item and "text" in item:
            raise InputError(f"{where}.text", "give the query's text once, as 'query' or as 'text'")
        text = item.pop("query", item.pop("text", None))
        if text is None:
            raise InputError(f"{where}.query", "each query needs a 'query' (or 'text') field")
        return text, item
    if isinstance(item, tuple) and len(item) == 2:
        return item
    raise InputError(where, "each query is a string or a dict with 'query' and options")


def _naming(exc: Exception, where: str) -> Exception:
    """``exc`` as the error of one query of a batch: its type and attributes
    kept, ``where`` (``queries[i]``) in what it says (an ``InputError``'s field
    becomes ``queries[i].field``)."""
    named = type(exc).__new__(type(exc))  # not type(exc)(...): constructors take other arguments
    named.__dict__.update(exc.__dict__)
    if isinstance(named, InputError):
        named.field = f"{where}.{named.field}"
        named.args = (named.field, named.reason)
    else:
        named.args = (f"{where}: {exc}",)
    named.__cause__ = exc
    return named


def search_many(
    queries: Iterable[Any],
    batch_size: int | None = None,
    *,
    return_exceptions: bool = False,
    progress: Callable[[int], None] | None = None,
    in_flight: int | None = None,
) -> list[Any]:
    """Run many queries, ``batch_size`` per canvas, every batch in flight at once.

    Each query is a string or a dict ``{"query": ..., **options}``. Results
    come back in input order. Each query has its own deadline,
    ``DIMPLE_TASK_TIMEOUT_S`` from when its batch was sent (its stages expire
    then, unrun if still queued): waiting on one batch never eats into
    another's time. A batch that fails raises its error, or with
    ``return_exceptions`` puts one in each of its queries' places, naming the
    query (``queries[i]``) and what happened to it: ``QueryTimeoutError`` (no
    answer by its deadline), ``StageLostError`` (the broker lost its stages:
    restarted without its data), ``BrokerUnavailableError`` (the broker could
    not be reached), ``StageError`` (a stage failed), an ``InputError`` a stage
    raised (its field ``queries[i].as_of``: a snapshot the lake does not
    hold); so every query is either answered or reported failed. Every query
    is checked before any batch is sent: a bad one raises ``InputError``
    naming it (``queries[i].max_units``), and nothing runs. ``progress``, when
    given, is called with the number of queries of each batch as its results
    are collected.

    ``in_flight`` bounds how many batches are on the workers at once (the next
    is sent as the oldest is collected): the shape for query sets too large
    to finish within one timeout (``dimple eval``).

    Embedded, batches run one after the other (each is done when dispatched),
    so each ``total_ms`` is its own batch's time, not the whole call's.
    """
    settings = resources.current().settings()
    if isinstance(queries, (str, bytes)) or not isinstance(queries, Iterable):
        raise InputError("queries", "must be a list of queries")
    items = [_split(q, f"queries[{i}]") for i, q in enumerate(queries)]
    size = settings.query_batch_size if batch_size is None else batch_size
    limit = settings.limits.max_batch_queries
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= limit:
        raise InputError("batch_size", f"must be a whole number from 1 to {limit}")
    if in_flight is not None and (isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1):
        raise InputError("in_flight", "must be a whole number of batches, at least 1")
    for i, (text, options) in enumerate(items):  # every query checked before any is sent: a bad one sends none
        try:
            make_query(text, options, settings)
        except InputError as exc:
            raise InputError(f"queries[{i}].{exc.field}", exc.reason) from None
    chunks = [(start, items[start : start + size]) for start in range(0, len(items), size)]
    out: list[Any] = []

    def failed(first: int, count: int, exc: Exception) -> list[Exception]:
        """One error per query of a failed batch, each naming its query."""
        return [_naming(exc, f"queries[{first + i}]") for i in range(count)]

    def collect(first: int, count: int, handle: Any) -> None:
        if isinstance(handle, Exception):
            out.extend(failed(first, count, handle))
        else:
            due = handle.deadline if handle.deadline is not None else time.monotonic() + settings.task_timeout_s
            try:
                out.extend(handle.get(timeout=max(due - time.monotonic(), 0.0)))
            except DimpleError as exc:  # a timeout, a lost broker, a failed stage, what a stage refused (as_of)
                handle.release()
                if not return_exceptions:
                    raise
                out.extend(failed(first, count, exc))
        if progress is not None:
            progress(count)

    def dispatch(chunk: list) -> Any:
        try:
            return _dispatch(_batch(chunk), single=False)
        except DimpleError as exc:  # the broker unreachable; embedded, what the batch's stages refused
            if not return_exceptions:
                raise
            return exc

    if get_app().conf.task_always_eager:
        for first, chunk in chunks:
            collect(first, len(chunk), dispatch(chunk))
    elif in_flight:
        pending: deque = deque()
        for first, chunk in chunks:
            if len(pending) >= in_flight:
                collect(*pending.popleft())
            pending.append((first, len(chunk), dispatch(chunk)))
        while pending:
            collect(*pending.popleft())
    else:
        for first, count, handle in [(first, len(chunk), dispatch(chunk)) for first, chunk in chunks]:
            collect(first, count, handle)
    return out


# -- writes -----------------------------------------------------------------------------
class _DecodesWrite(_WaitIsGet):
    """``get()`` returns a ``WriteResult``; records the worker found invalid
    raise ``IngestValidationError`` (nothing written), a timeout
    ``IngestTimeoutError`` (a ``QueryTimeoutError``: the write may still be applied), a lost broker ``BrokerUnavailableError``, a broker
    that lost the write's message (restarted without its data) ``StageLostError``
    within about a second."""

    id: str
    broker: str = ""
    epoch: str | None = None  # the broker's epoch when the write was sent (broker_epoch)

    def get(self, *args: Any, **kwargs: Any) -> WriteResult:
        timeout = kwargs.pop("timeout", args[0] if args else None)
        try:
            value = _wait(super().get, timeout, lambda: broker_epoch.epochs().lost_since(self.broker, self.epoch),  # type: ignore[misc]
                          **kwargs)
        except _Lost:
            raise StageLostError(
                f"write {self.id} was lost: the broker restarted without its data; it may have been applied "
                "before (a write is idempotent: send it again)") from None
        except BROKER_DOWN as exc:
            reset_connections(get_app())
            raise BrokerUnavailableError(f"lost the broker or result backend while waiting: {exc}") from None
        except CeleryTimeoutError:
            raise IngestTimeoutError(
                f"write {self.id} not acknowledged within {timeout} s: it was sent and may still be applied "
                f"(it stays queued until an ingest worker runs it; a write is idempotent by id: "
                f"check with get() before sending it again)") from None
        except DimpleError:
            raise
        except Exception as exc:
            raise StageError(f"the write failed on a worker: {type(exc).__name__}: {exc}") from None
        if not value.get("ok", True):
            raise IngestValidationError([_line_error(e) for e in value["errors"]])
        value.pop("ok", None)
        return WriteResult.model_validate(value)

def _line_error(text: str) -> LineError:
    unit, _, rest = text.partition(" ")
    number, _, rest = rest.partition(": ")
    where, _, reason = rest.partition(": ")
    return LineError(int(number) if number.isdigit() else 0, where, reason, unit=unit)


class WriteAsyncResult(_DecodesWrite, AsyncResult):
    """An ``AsyncResult`` for a write sent to the ``ingest`` queue."""


class EagerWriteResult(_DecodesWrite, EagerResult):
    """The embedded counterpart: the write is on disk when returned."""


def _send(name: str, *args: Any) -> WriteAsyncResult | EagerWriteResult:
    app = get_app()
    task = app.tasks[name]
    if app.conf.task_always_eager:
        res = task.apply(args=list(args))
        if res.failed():
            raise res.result
        return EagerWriteResult(res.id, res.result, res.state)
    broker = app.conf.broker_url
    try:
        if not _ingest_consumed(broker):
            raise NoWorkerError("ingest", START_WORKER["ingest"])
        epoch = broker_epoch.epochs().current(broker)
        handle = task.apply_async(args=list(args))
    except (*BROKER_DOWN, broker_epoch.redis.RedisError) as exc:
        reset_connections(app)
        raise BrokerUnavailableError(f"cannot reach the broker: {exc}") from None
    out = WriteAsyncResult(handle.id, app=app)
    out.broker, out.epoch = broker, epoch
    return out


def _ingest_consumed(broker: str) -> bool:
    """Whether a live worker consumes ``ingest``: the workers' presence in
    Redis (``workers.presence``, two small commands); when that says none (or cannot
    tell), the workers are asked, as ``dimple ingest --via-broker`` asks them
    (a worker that has just started may not have announced itself yet)."""
    return bool(presence.consumes(broker, "ingest")) or "ingest" in _ask_consumers()


def remember_async(records: Any, *, skip_invalid: bool = False) -> WriteAsyncResult | EagerWriteResult:
    """Remember one memory (a dict, the fields of an ingest line) or a list of
    them: an upsert by id (an id is derived from namespace and content when
    none is given). ``.get()`` returns a ``WriteResult`` once the write is on
    disk and visible to the next query.

    Records are validated here first: a bad one raises ``IngestValidationError``
    naming the record (from 1) and the field, and nothing is sent. With
    ``skip_invalid`` every record goes to the writer, which skips the bad ones
    and reports each in ``skipped`` under the caller's own number.
    """
    settings = resources.current().settings()
    parsed = parse_records(records, settings)
    if parsed.errors and not skip_invalid:  # checks against the store (edge targets) run on the worker
        raise IngestValidationError(sorted(parsed.errors, key=lambda e: (e.line, e.field)))
    if parsed.errors:  # the writer numbers and reports them: send the caller's records as given
        return _send("ingest.remember", [json.loads(line) for line in record_lines(records)], skip_invalid)
    return _send("ingest.remember", [r.model_dump(mode="json", exclude_none=True) for r in parsed.records], skip_invalid)


def remember(records: Any, *, skip_invalid: bool = False) -> WriteResult:
    """``remember_async(...).get()``, waiting up to ``DIMPLE_TASK_TIMEOUT_S``."""
    return remember_async(records, skip_invalid=skip_invalid).get(timeout=resources.current().settings().task_timeout_s)


def memory_ids(ids: Any) -> list[str]:
    """``ids`` (one id or a list of them) as a list, each a memory id
    (``id_problem``: no NUL, no lone surrogate either); an ``InputError``
    naming ``ids`` or ``ids[i]`` otherwise."""
    if isinstance(ids, str):
        ids = [ids]
    elif isinstance(ids, bytes | dict) or not isinstance(ids, Iterable):
        raise InputError("ids", "a memory id or a list of them")
    wanted = list(ids)
    for i, mid in enumerate(wanted):
        if (problem := id_problem(mid)) is not None:
            raise InputError(f"ids[{i}]", problem)
    return wanted


def forget_async(ids: str | Iterable[str], reason: str | None = None) -> WriteAsyncResult | EagerWriteResult:
    """Forget memories by id: they leave every result and every link at once,
    and the store's files at the next compaction. Unknown ids are reported
    in ``not_found``, not refused."""
    return _send("ingest.forget", forget_arguments(ids, reason), reason)


def forget_arguments(ids: Any, reason: Any) -> list[str]:
    """The checks ``forget`` makes before sending anything: at least one
    memory id (``memory_ids``), a ``reason`` of text or none; the ids as a list."""
    wanted = memory_ids(ids)
    if not wanted:
        raise InputError("ids", "give at least one memory id")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 10_000 or text_problem(reason)):
        raise InputError("reason", "text of at most 10,000 characters")
    return wanted


def forget(ids: str | Iterable[str], reason: str | None = None) -> WriteResult:
    """``forget_async(...).get()``, waiting up to ``DIMPLE_TASK_TIMEOUT_S``."""
    return forget_async(ids, reason).get(timeout=resources.current().settings().task_timeout_s)


def get(ids: str | Iterable[str], min_version: int | None = None) -> list[dict[str, Any]]:
    """The live memories among ``ids`` as written (fields of an ingest line),
    in the order asked; unknown and forgotten ids are left out. An id that is
    not one (not a string, blank, over 512 characters) raises ``InputError``
    naming it (``ids[i]``). ``min_version`` (a write's ``version``) is
    read-your-writes, as a search's: the answer comes from that store version
    or a later one (``VersionNotReachedError`` after ``store.min_version_wait_ms``)."""
    wanted = memory_ids(ids)
    if min_version is not None and (type(min_version) is not int or min_version < 0):
        raise InputError("min_version", f"{min_version!r} is not a store version (an integer >= 0, "
                                        "e.g. the `version` a write returned)")
    app = get_app()
    if app.conf.task_always_eager:
        return get_task(wanted, min_version)
    timeout = resources.current().settings().task_timeout_s
    sent = time.monotonic()
    try:  # a message no worker took by then is discarded, as a query's stages are
        # without min_version, the message a worker of the release before reads too
        args = [wanted] if min_version is None else [wanted, min_version]
        handle = app.tasks["store.get"].apply_async(args=args, expires=timeout)
        return handle.get(timeout=timeout)
    except BROKER_DOWN as exc:
        reset_connections(app)
        raise BrokerUnavailableError(f"cannot reach the broker or result backend: {exc}") from None
    except CeleryTimeoutError:
        stop_waiting(handle)
        raise QueryTimeoutError(f"no answer for store.get {handle.id} within {time.monotonic() - sent:.1f} s of "
                                f"sending it; {_why_no_answer(('search',))}") from None


# -- the audit trail ---------------------------------------------------------------------
def replay_row(row: AuditRecord) -> dict[str, Any]:
    """Re-run a logged query with its recorded options; compare the served list.

    Embedded, the replay writes no audit row of its own (it is run with
    ``audit_enabled`` off); through a broker the workers log it, marked as a
    replay (``Origin``, so no replay of the log replays it), and ``logged_as`` names its row.
    """
    if row.query_text is None:
        return {"verdict": "not possible: the query text was not stored (DIMPLE_STORE_QUERY_TEXT=false)", "changes": []}
    settings = resources.current().settings()
    at = replay_snapshot(row)
    options = replay_options(row)
    gone = None
    # embedded, this thread's replay alone goes unlogged: not every thread's query, by a settings change
    with unlogged() if settings.embedded else nullcontext():
        try:
            now = search(row.query_text, **options, **({"as_of": at} if at is not None else {}))
        except InputError as exc:  # the lake no longer holds the row's snapshot (store.retain)
            if at is None or exc.field != "as_of":
                raise
            gone, at = exc.reason, None
            now = search(row.query_text, **options)
    diff = diff_served([s["id"] for s in row.sources], [r.id for r in now.results])
    changes = diff["changes"]
    verdict = "same list" if diff["same"] else f"{len(changes)} change(s)"
    moved = store_changed(row, now.store_version)
    if moved and not diff["same"]:
        verdict += f"; {moved}"
    if gone is not None:
        verdict += f"; replayed on the current store, the row's snapshot is not held any more ({gone})"
    return {"verdict": verdict, "changes": changes, "store_changed": moved, "replayed_at": at,
            "replay_query_id": now.query_id, "logged_as": None if settings.embedded else now.query_id}


def replay_snapshot(row: AuditRecord) -> int | None:
    """The snapshot a logged query read, to replay it there (the lake keeps
    ``store.retain`` of snapshots), so a replay shows what a setting change did
    and not what later writes did; None for a row that names no snapshot (one
    logged by the segment store of earlier versions: the replay says when the
    store moved). A query asked ``as_of`` a snapshot (recorded in its options) replays there
    (its ``store_version`` is that snapshot too, and the one a time resolved to)."""
    as_of = row.options.get("as_of")
    version = as_of if isinstance(as_of, int) and not isinstance(as_of, bool) else row.query_profile.get("store_version")
    if not isinstance(version, int) or version < 1:
        return None
    return version


QUERY_ID_CHARS = 32  # a query id whole (``contracts.Query.id``: a uuid's hex digits); shorter: a prefix


def audit_row(query_id: Any) -> AuditRecord:
    """The audit row of ``query_id`` (a query id, or a unique prefix of one of
    at least 4 characters); an ``InputError`` naming ``query_id`` when there is
    none. Embedded, this process's rows still waiting for the writer are
    written first, so a query just answered can be looked up, and a prefix
    is matched against it too (found alone, an older row sharing the prefix
    would have been taken for it)."""
    if not isinstance(query_id, str) or not query_id.strip() or text_problem(query_id):
        raise InputError("query_id", "must be a query id: a non-blank string, valid Unicode without NUL")
    settings = resources.current().settings()
    if settings.embedded and len(query_id) < QUERY_ID_CHARS and audit_pending():  # a prefix: matched against them too
        flush_audit()
    row = audit.find(audit.log_of(settings), query_id)
    if row is None and settings.embedded and flush_audit():  # this process's rows may still be on their way
        row = audit.find(audit.log_of(settings), query_id)
    if row is None:
        off = "" if settings.audit_enabled else " (audit rows are off: DIMPLE_AUDIT_ENABLED=false)"
        raise InputError("query_id", f"no audit row for query {query_id!r} in {audit.log_of(settings)}{off}")
    return row


def explain(query_id: str, *, replay: bool = True) -> dict[str, Any]:
    """Why each result of a logged query was served, from its audit row alone
    (``pipeline.audit.explain``: leg ranks, RRF terms, recency, the budget's
    cut in ``truncation``), and with ``replay`` whether re-running it now gives
    the same list (``replay_row``): what ``dimple audit explain --json`` prints."""
    row = audit_row(query_id)
    return {"query_id": row.query_id, "results": audit.explain(row), "truncation": row.truncation,
            "replay": replay_row(row) if replay else None}


__all__ = ["search", "search_async", "search_many", "remember", "remember_async", "forget", "forget_async", "get",
           "explain", "explain_miss", "QueryOptions", "Results", "WriteResult", "WhyNot"]
def explain_miss(query_id: str, memory_id: str) -> WhyNot:
    """Why memory ``memory_id`` was not among the results of query ``query_id``
    (its ``Results.query_id``, or a unique prefix of at least 4 characters):
    the logged query (its audit row) replayed in this process, stage by stage,
    on the lake engine at the snapshot it read (while the lake holds it), else
    on the store as it is now (``pipeline.audit.whynot``), naming the stage
    that dropped the memory and the numbers behind it (or the rank it was
    returned at). Embedded or through a broker, it reads the store and the
    audit log here; the query embedder loads here for a vector leg.

    Raises ``InputError`` naming ``query_id`` (no such row; its text was not
    stored) or ``memory_id`` (not a memory id; not in the store).
    """
    res = resources.current()
    row = audit_row(query_id)
    snapshot, at = res.snapshot(), replay_snapshot(row)
    if at is not None:
        try:
            snapshot = res.reader().as_of(at)
        except InputError as exc:  # not held any more: the current store, and the answer's caveat says it moved
            if exc.field != "as_of":
                raise
    return why_not(row, memory_id, res, snapshot)


