"""Library code the command line, the demo and ``dimple eval`` share: settings
for a command-line process, ingest (here or through the broker), and the
replay of a logged query.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.errors import InputError


def cli_settings():
    from pipeline.settings import get_settings

    settings = get_settings()
    logging.basicConfig(level=settings.log_level, format="%(levelname)s %(name)s %(message)s")
    # Embedded runs execute tasks in-process; Celery's per-task INFO lines
    # (with whole batches as results) are for worker logs, not the terminal.
    logging.getLogger("celery").setLevel(max(logging.WARNING, logging.getLogger().level))
    return settings


def ingest_file(path: Path, settings, *, skip_invalid: bool = False, progress: bool = True):
    """Validate ``path`` in full, then write it in one transaction (the CLI's ingest)."""
    from pipeline.store import ingest

    parsed = ingest.read_file(path, settings.limits)
    return ingest.write_parsed(parsed, settings, skip_invalid=skip_invalid, progress=progress)


def ingest_via_broker(path: Path, settings, *, skip_invalid: bool = False):
    """Check that a worker consumes the ``ingest`` queue, validate the whole
    file here, then send it in batches, in order, to ``ingest.batch``.

    Yields one result dict per batch (``first_line``, ``lines`` and the
    worker's report) as each batch is acknowledged. With no ingest worker it
    raises ``NoWorkerError`` and sends nothing. Each batch is waited for
    ``settings.ingest_batch_wait_s``; past that ``IngestTimeoutError`` says
    which lines were sent (that batch stays queued and is applied when a
    worker runs it) and which were not (nothing after it is sent).
    """
    from celery.exceptions import TimeoutError as CeleryTimeoutError

    from pipeline.errors import BrokerUnavailableError, IngestTimeoutError, NoWorkerError, StageError
    from pipeline.store import generations, ingest
    from pipeline.store.database import Store
    from workers.api import _BROKER_DOWN
    from workers.app import START_WORKER, consumed_queues
    from workers.celery_compat import stop_waiting
    from workers.tasks import ingest_batch

    need_broker(settings)
    try:
        if "ingest" not in consumed_queues():
            raise NoWorkerError("ingest", START_WORKER["ingest"])
    except _BROKER_DOWN as exc:
        raise BrokerUnavailableError(f"cannot reach the broker: {exc}") from None
    lines = ingest.read_lines(path)  # validated here, then sent as they are, numbered alike
    parsed = ingest.parse_lines(lines, settings.limits)
    published = generations.current(settings.data_dir)
    existing = Store.open(published, read_only=True) if published is not None else None
    try:
        ingest.validate(parsed, existing, skip_invalid)
    finally:
        if existing is not None:
            existing.close()
    size, wait_s = settings.ingest_batch_size, settings.ingest_batch_wait_s
    for start in range(0, len(lines), size):
        chunk = lines[start : start + size]
        end = start + len(chunk)
        batch = f"the batch of {_lines(start + 1, end)}"
        rest = f"nothing after it was sent ({_lines(end + 1, len(lines))})" if end < len(lines) else "it was the last"
        try:
            handle = ingest_batch.apply_async(args=[chunk, start + 1, skip_invalid])
        except _BROKER_DOWN as exc:
            raise BrokerUnavailableError(f"cannot reach the broker: {exc}") from None
        try:
            result = handle.get(timeout=wait_s)
        except _BROKER_DOWN as exc:
            raise BrokerUnavailableError(f"cannot reach the broker: {exc}") from None
        except CeleryTimeoutError:
            stop_waiting(handle)
            raise IngestTimeoutError(
                f"{batch} was sent but not acknowledged within {wait_s:g} s (DIMPLE_INGEST_BATCH_TIMEOUT_S): "
                f"it stays in the ingest queue and is applied when an ingest worker runs it "
                f"(it may be running now); {rest}. Ingest upserts by id: sending the file again is safe"
            ) from None
        except Exception as exc:  # the batch raised on the worker: Celery rebuilt its error
            raise StageError(f"{batch} failed on the ingest worker: {type(exc).__name__}: {exc}; {rest}") from None
        yield {"first_line": start + 1, "lines": len(chunk), **result}


def _lines(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first}-{last}"


def replay_row(row) -> dict[str, Any]:
    """Re-run a logged query with its recorded options; compare the served list."""
    if row.query_text is None:
        return {"verdict": "not possible: the query text was not stored (DIMPLE_STORE_QUERY_TEXT=false)", "changes": []}
    from pipeline.audit.explain import diff_served, replay_options
    from workers.api import search

    now = search(row.query_text, **replay_options(row))
    diff = diff_served([s["id"] for s in row.sources], [r.id for r in now.results])
    changes = diff["changes"]
    return {"verdict": "same list" if diff["same"] else f"{len(changes)} change(s)", "changes": changes,
            "replay_query_id": now.query_id}


def need_broker(settings) -> None:
    if settings.embedded:
        raise InputError("DIMPLE_BROKER_URL", "not set: workers and Flower need a broker (e.g. redis://127.0.0.1:6379/0)")
