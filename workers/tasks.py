"""Thin Celery tasks: validate the batch, call the pipeline stage, return JSON."""

from __future__ import annotations

from contextlib import contextmanager

from pydantic import ValidationError

from pipeline.audit.record import AuditRecord
from pipeline.contracts import Batch, vectors_consumed
from pipeline.errors import AuditWriteError, IngestValidationError, StageError
from pipeline.stages.augment import augment_batch
from pipeline.stages.budget import budget_batch
from pipeline.stages.descend import descend_batch
from pipeline.stages.embed import embed_batch
from pipeline.stages.fulltext import fulltext_batch
from pipeline.stages.fuse import fuse_batch
from pipeline.stages.scope import scope_batch
from pipeline.store.database import created_at_of
from pipeline.store.ingest import parse_lines, write_parsed

from . import audit, resources
from .app import app


@contextmanager
def _cursor():
    cur = resources.cursor()
    try:
        yield cur
    finally:
        if cur is not None:
            cur.close()


# Every stage but the last passes its batch on in the next task's message:
# only the final result is stored (and failures, task_store_errors_even_if_ignored,
# which the caller's parent check reads), not one stored copy per hop.


def _out(batch: Batch) -> dict:
    return batch.model_dump(mode="json")


def _in(batch: dict, stage: str) -> Batch:
    """The batch a stage received; a malformed one is a ``StageError`` naming
    the stage and the field (it travels as JSON, unlike pydantic's own error)."""
    try:
        return Batch.model_validate(batch)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise StageError(f"search.{stage} got a malformed batch: {where}: {err['msg']}") from None


@app.task(name="search.embed", ignore_result=True)
def embed(batch: dict) -> dict:
    return _out(embed_batch(_in(batch, "embed"), resources.LazyEmbedder()))


@app.task(name="search.descend", ignore_result=True)
def descend(batch: dict) -> dict:
    index = resources.index()
    with _cursor() as cur:
        return _out(vectors_consumed(descend_batch(_in(batch, "descend"), index, cur, resources.settings().tree)))


@app.task(name="search.fulltext", ignore_result=True)
def fulltext(batch: dict) -> dict:
    with _cursor() as cur:
        return _out(fulltext_batch(_in(batch, "fulltext"), cur, resources.settings().fulltext))


@app.task(name="search.fuse", ignore_result=True)
def fuse(parts: list[dict]) -> dict:
    with _cursor() as cur:
        created = (lambda ids: created_at_of(cur, ids)) if cur is not None else (lambda ids: {})
        batch = fuse_batch([_in(p, "fuse") for p in parts], resources.settings().rrf_k, created)
    return _out(batch)


@app.task(name="search.augment", ignore_result=True)
def augment(batch: dict) -> dict:
    with _cursor() as cur:
        return _out(augment_batch(_in(batch, "augment"), cur, resources.settings().preview_chars))


@app.task(name="search.scope", ignore_result=True)
def scope(batch: dict) -> dict:
    return _out(scope_batch(_in(batch, "scope")))


@app.task(name="search.budget")
def budget(batch: dict) -> dict:
    out = budget_batch(_in(batch, "budget"))
    audit.emit(out)
    return _out(out)


@app.task(name="audit.write", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def audit_write(self, records: list[dict]) -> dict:
    """Write a batch's retrieval_log rows; retried with backoff, then dead-lettered, never swallowed."""
    settings = resources.settings()
    rows = [AuditRecord.model_validate(r) for r in records]
    try:
        inserted = resources.audit_writer().write(settings.audit_path, rows)
    except AuditWriteError as exc:
        if self.request.retries >= settings.audit_max_retries:
            raise audit.give_up(settings, rows, exc, self.request.retries) from None
        raise self.retry(countdown=audit.backoff_s(settings, self.request.retries), max_retries=None) from None
    return {"rows": len(rows), "inserted": inserted}


@app.task(name="ingest.batch", acks_late=True, reject_on_worker_lost=True)
def ingest_batch(lines: list[str], first_line: int = 1, skip_invalid: bool = False) -> dict:
    """Ingest JSONL lines as one transaction and publish a new store generation.

    Bad lines come back as data (line numbers of the caller's file), not as an
    exception, so the caller can print them. Re-running a batch is harmless:
    ingest upserts by id.
    """
    settings = resources.settings()
    parsed = parse_lines(lines, settings.limits, start=first_line)
    try:
        report = write_parsed(parsed, settings, skip_invalid=skip_invalid, embedder=resources.embedder())
    except IngestValidationError as exc:
        return {"ok": False, "errors": [str(e) for e in exc.errors]}
    return {"ok": True, **report.as_dict()}
