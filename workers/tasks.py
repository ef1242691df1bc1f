"""Task registrations (``register``, called by ``workers.app.build_app``): each
stage of ``pipeline.stages.registry.STAGES`` as a Celery task of the same name,
plus ``audit.write``, the writes (``ingest.batch``, ``ingest.remember``,
``ingest.forget``, ``ingest.compact``) and ``store.get``.

A stage task validates its message into a ``Batch`` (a malformed one is a
``StageError`` naming the stage and the field), runs the stage with this
process's resources and returns JSON.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, Task, states
from celery.exceptions import Ignore
from pydantic import ValidationError

from pipeline.audit.lake import log_of
from pipeline.audit.writer import write_records
from pipeline.contracts import Batch, check_query
from pipeline.errors import AuditWriteError, IngestValidationError, StageError, problems
from pipeline.stages.registry import STAGES, Stage
from pipeline.store.compact import CompactReport
from pipeline.store.ingest import parse_lines
from pipeline.store.maintenance import compact
from pipeline.store.writes import compaction_due, get, parse_records, write

from . import audit, resources, upkeep

log = logging.getLogger("dimple.worker")


class HandedOn:
    """A stage's ``Batch`` handed to the next stage of an embedded canvas as it
    is (``workers.canvas.run_eager`` asks for it: ``request.hand_on``), not as
    JSON the next stage validates again: in one process the two are the same
    batch (``test_eager_canvas``: the answer is the one Celery's ``apply()``
    gives through JSON at every stage), and the round trip cost ~1.1 ms of a
    hybrid query on the demo store. On workers every stage sends JSON.
    Celery writes a repr of each task's result whatever its log level: this
    one's is short, where the batch's own walks every candidate."""

    __slots__ = ("batch",)

    def __init__(self, batch: Batch):
        self.batch = batch

    def __repr__(self) -> str:
        return "<HandedOn Batch>"


def _in(batch: object, stage: str) -> Batch:
    """The batch a stage received; a malformed one is a ``StageError`` naming
    the stage and the field (it travels as JSON, unlike pydantic's own error).
    A batch handed on in process (``HandedOn``) is an earlier stage's own,
    whose queries the first stage checked."""
    if isinstance(batch, HandedOn):
        return batch.batch
    try:
        out = Batch.model_validate(batch)
    except ValidationError as exc:
        where, msg, _ = problems(exc)[0]
        raise StageError(f"{stage} got a malformed batch: {where}: {msg}") from None
    limits = resources.current().settings().limits
    for state in out.states:  # the API's limits, whoever sent the message
        check_query(state.query, limits)
    return out


# Every stage but the last passes its batch on in the next task's message:
# only the final result is stored (and failures, task_store_errors_even_if_ignored,
# which the caller's parent check reads), not one stored copy per hop.
LAST = "search.budget"
EMBED = "search.embed"  # the one stage that reads no store


# Celery builds a repr of every task's result (for its success log line and
# task event), up to this many characters, whether or not anything shows it:
# for a stage, a walk over the batch, ~0.1 ms of the ~0.5 ms Celery adds to
# each task in eager mode. Nested three levels deep the repr showed only
# ``{'states': [{'query': {...}, ...}]}`` anyway; the log line keeps the task's
# name, id and time.
RESULT_REPR_CHARS = 0


def stage_task_id(canvas_id: str, stage: str) -> str:
    """The task id of ``stage`` in the canvas ``canvas_id``: the last stage's is
    the canvas id itself (what the caller waits on), every other's derives from it."""
    return canvas_id if stage == LAST else f"{canvas_id}:{stage}"


def already_answered(app: Celery, request: Any) -> bool:
    """Whether ``request`` is a stage delivered again (its worker died before
    acknowledging it) of a canvas whose answer is already stored: the stage
    ran before and its query was answered, so running it again is only waste."""
    info = getattr(request, "delivery_info", None) or {}
    task_id = getattr(request, "id", None)
    if not info.get("redelivered") or not isinstance(task_id, str):
        return False
    return app.backend.get_task_meta(task_id.partition(":")[0]).get("status") == "SUCCESS"


def _register(app: Celery, stage: Stage) -> Task:
    def run(payload):
        request = getattr(app.current_task, "request", None)
        if already_answered(app, request):
            log.info("%s delivered again after its query was answered: not run again", stage.name)
            raise Ignore()
        batch: Batch | list[Batch]
        if stage.fan_in:  # the chord's list of leg batches, or a lone leg's batch (workers.canvas)
            batch = [_in(p, stage.name) for p in (payload if isinstance(payload, list) else [payload])]
        else:
            batch = _in(payload, stage.name)
        res = resources.current()
        if stage.name != EMBED:  # every stage reading the store answers from min_version or later
            res.reach(batch)
            with res.pinned(batch):  # or from the snapshot as_of names
                out = stage.run(batch, res)
        else:
            out = stage.run(batch, res)
        if stage.name == LAST:
            audit.emit(app, out)
        if getattr(request, "hand_on", False):
            return HandedOn(out)
        return out.model_dump(mode="json")

    run.__name__ = run.__qualname__ = stage.name.rpartition(".")[2]
    run.__doc__ = f"The {stage.name} stage (pipeline.stages.registry)."
    return app.task(name=stage.name, ignore_result=stage.name != LAST, resultrepr_maxsize=RESULT_REPR_CHARS)(run)


def audit_write(self, records: list[dict], outbox: list[str] | str | None = None, host: str | None = None,
                unkept: int | None = None) -> dict:
    """Write a batch's retrieval_log rows; retried with backoff, then dead-lettered, never swallowed.
    ``outbox`` names the files keeping the rows after the first ``unkept`` (``workers.audit``: a
    search process's rows of a second; one name from an earlier dimple), read for their rows as
    they are now (``audit.message_rows``) and removed once they are in; ``host`` the outbox they
    are in. The rows of this host's other outbox files waiting now go in the same transaction
    (``audit.batch_of``), and a message whose rows all went so writes nothing."""
    res = resources.current()
    settings = res.settings()
    audit.start_drainer()  # pools without worker_process_init (solo, threads) drain too
    if not unkept and audit.written_with_another(settings, outbox, host):  # rows no file kept go in anyway
        return {"rows": len(records) if isinstance(records, list) else 1, "inserted": 0, "refused": 0,
                "batched": True}
    sent, (records, kept) = records, audit.message_rows(settings, records, outbox, host, unkept)
    rows, refused = audit.valid_records(settings, records)
    if rows or kept:
        audit.PACE.wait()  # at most one transaction a second: what came meanwhile goes with these rows
        # its files read again after the wait, just before the write: a `dimple audit purge` during
        # the wait took rows from them, which would otherwise go in after it (SECURITY.md)
        kept = audit.message_rows(settings, sent, outbox, host, unkept)[1]
    rows += kept
    others = audit.batch_of(settings, outbox) if rows else []
    try:
        inserted = write_records(log_of(settings), rows + [r for _, batch in others for r in batch])
    except AuditWriteError as exc:
        if self.request.retries >= settings.audit_max_retries:
            error = audit.give_up(settings, rows, exc, self.request.retries)
            audit.done(settings, outbox)
            raise error from None
        raise self.retry(countdown=audit.backoff_s(settings, self.request.retries), max_retries=None) from None
    finally:
        audit.PACE.wrote()
    audit.done(settings, outbox)
    for path, _ in others:
        audit.done(settings, path.name)
    return {"rows": len(rows), "inserted": inserted, "refused": refused,
            **({"with_others": len(others)} if others else {})}


def _written(task: Task, run) -> dict:
    """A write's report as JSON (bad records come back as data, numbered as the
    caller numbered them); a compaction is sent when the deltas passed a threshold."""
    app = task.app
    upkeep.start(app)  # solo and threads pools, and embedded processes, check for due erases too
    if (answered := _answered_before(task)) is not None:
        return answered
    try:
        report = run()
    except IngestValidationError as exc:
        return {"ok": False, "errors": [str(e) for e in exc.errors]}
    if report.compact_due:
        app.tasks["ingest.compact"].apply_async(kwargs={"when_due": True})
    return {"ok": True, **report.as_dict()}


def _answered_before(task: Task) -> dict | None:
    """The answer a run of this message already stored (it is delivered again:
    the worker that ran it died before acknowledging it), marked ``replayed``.
    The lake's write ids make a committed write a replay; this covers one
    that found nothing to change, which commits nothing and, run again after
    a later write, would undo it (a forget of an id written since, a memory
    put back as it was). The result backend keeps answers ``result_expires``
    (a day); None when no run finished, in-process (eager), or the backend
    cannot be read (the lake's check still holds)."""
    if task.request.is_eager or not task.request.id:
        return None
    try:
        meta = task.backend.get_task_meta(task.request.id, cache=False)
    except Exception as exc:  # noqa: BLE001 - an answer unread is a write run again, as before
        log.warning("could not read the stored answer of %s: %s", task.request.id, exc)
        return None
    result = meta.get("result")
    if meta.get("status") != states.SUCCESS or not isinstance(result, dict):
        return None
    return {**result, "replayed": True} if result.get("ok") else result


# Writes: one delta each (pipeline.store.writes), acknowledged once on disk.
# A message delivered again after its write was published is not applied
# twice (the task id is the write id: ``replayed``), nor is one whose run
# ended, whatever it changed (its stored answer: ``_answered_before``); one
# whose write did not land is applied when delivered again.
def ingest_batch(self, lines: list[str], first_line: int = 1, skip_invalid: bool = False) -> dict:
    """Remember JSONL lines (``dimple ingest --via-broker``), numbered from ``first_line``."""
    res = resources.current()
    settings = res.settings()
    parsed = parse_lines(lines, settings.limits, start=first_line)
    return _written(self, lambda: write(settings, parsed, skip_invalid=skip_invalid, embedders=res.embedder,
                                            reader=res.reader(), write_id=self.request.id))


def remember_task(self, records: list[dict], skip_invalid: bool = False) -> dict:
    """``workers.api.remember`` through the broker."""
    res = resources.current()
    settings = res.settings()
    parsed = parse_records(records, settings)
    return _written(self, lambda: write(settings, parsed, skip_invalid=skip_invalid, embedders=res.embedder,
                                            reader=res.reader(), write_id=self.request.id))


def forget_task(self, ids: list[str], reason: str | None = None) -> dict:
    """``workers.api.forget`` through the broker."""
    res = resources.current()
    settings = res.settings()
    return _written(self, lambda: write(settings, forget=ids, reason=reason, reader=res.reader(),
                                            write_id=self.request.id))


def compact_task(rebuild: bool = False, erase: bool = False, when_due: bool = False) -> dict:
    """Compact the lake (``pipeline.store.maintenance.compact``: a base at the
    latest snapshot, the erase when one is due, or of every forget waiting
    with ``erase``); returns at once when another compaction is running.
    ``when_due`` (a write past a threshold sent it): only if one is still due
    (``compaction_due``), so a burst of writes compacts once, not once each."""
    res = resources.current()
    settings = res.settings()
    if when_due and not compaction_due(settings, res.reader()):
        return CompactReport(ran=False).as_dict()
    return compact(settings, rebuild=rebuild, erase=erase).as_dict()


def get_task(ids: list[str], min_version: int | None = None) -> list[dict]:
    """``workers.api.get`` through the broker: the live memories among ``ids``,
    read from store version ``min_version`` or a later one."""
    res = resources.current()
    if min_version:
        res.reader().at_least(min_version, res.settings().store.min_version_wait_ms / 1000.0)
    return get(res.settings(), ids, reader=res.reader())


def register(app: Celery) -> dict[str, Task]:
    """Register every task on ``app``; returns them by name."""
    out = {name: _register(app, stage) for name, stage in STAGES.items()}
    late = {"acks_late": True, "reject_on_worker_lost": True}
    for name, fn, options in (
        ("audit.write", audit_write, {"bind": True, "max_retries": None, **late}),
        ("ingest.batch", ingest_batch, {"bind": True, **late}),
        ("ingest.remember", remember_task, {"bind": True, **late}),
        ("ingest.forget", forget_task, {"bind": True, **late}),
        ("ingest.compact", compact_task, late),
        ("store.get", get_task, {}),
    ):
        out[name] = app.task(name=name, **options)(fn)
    return out
