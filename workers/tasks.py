"""Thin Celery tasks: validate the batch, call the pipeline stage, return JSON."""

from __future__ import annotations

import logging
import random
from contextlib import contextmanager

from pipeline.audit import AuditRecord, AuditRetriesExhausted, AuditWriteError, dead_letter, write_record
from pipeline.budget import budget_batch
from pipeline.contracts import Batch
from pipeline.embed import embed_batch
from pipeline.fulltext import fulltext_batch
from pipeline.fuse import fuse_batch
from pipeline.graph import augment_batch
from pipeline.scope import scope_batch
from pipeline.store import created_at_of
from pipeline.vector import descend_batch

from . import audit, resources
from .app import app

log = logging.getLogger("dimple.audit")


@contextmanager
def _cursor():
    cur = resources.cursor()
    try:
        yield cur
    finally:
        if cur is not None:
            cur.close()


def _out(batch: Batch) -> dict:
    return batch.model_dump(mode="json")


@app.task(name="search.embed")
def embed(batch: dict) -> dict:
    return _out(embed_batch(Batch.model_validate(batch), resources.LazyEmbedder()))


@app.task(name="search.descend")
def descend(batch: dict) -> dict:
    index = resources.index()
    with _cursor() as cur:
        return _out(descend_batch(Batch.model_validate(batch), index, cur, resources.settings().tree))


@app.task(name="search.fulltext")
def fulltext(batch: dict) -> dict:
    with _cursor() as cur:
        return _out(fulltext_batch(Batch.model_validate(batch), cur, resources.settings().fulltext))


@app.task(name="search.fuse")
def fuse(parts: list[dict]) -> dict:
    with _cursor() as cur:
        created = (lambda ids: created_at_of(cur, ids)) if cur is not None else (lambda ids: {})
        batch = fuse_batch([Batch.model_validate(p) for p in parts], resources.settings().rrf_k, created)
    return _out(batch)


@app.task(name="search.augment")
def augment(batch: dict) -> dict:
    with _cursor() as cur:
        return _out(augment_batch(Batch.model_validate(batch), cur, resources.settings().preview_chars))


@app.task(name="search.scope")
def scope(batch: dict) -> dict:
    return _out(scope_batch(Batch.model_validate(batch)))


@app.task(name="search.budget")
def budget(batch: dict) -> dict:
    out = budget_batch(Batch.model_validate(batch))
    audit.emit(out)
    return _out(out)


@app.task(name="audit.write", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def audit_write(self, record: dict) -> dict:
    """Write one retrieval_log row; retried with backoff, then dead-lettered, never swallowed."""
    settings = resources.settings()
    row = AuditRecord.model_validate(record)
    try:
        inserted = write_record(settings.audit_path, row)
    except AuditWriteError as exc:
        if self.request.retries >= settings.audit_max_retries:
            dead_letter(settings.dead_letter_dir, row, str(exc))
            log.error("audit.write gave up on query %s after %d retries: %s (kept for 'dimple audit retry')",
                      row.query_id, self.request.retries, exc)
            raise AuditRetriesExhausted(f"query {row.query_id}: {exc}") from None
        backoff = min(settings.audit_backoff_max_s, 2.0 ** self.request.retries)
        raise self.retry(countdown=backoff * random.uniform(0.5, 1.0), max_retries=settings.audit_max_retries)
    return {"query_id": row.query_id, "inserted": inserted}
