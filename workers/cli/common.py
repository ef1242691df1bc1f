"""Library code the command line, the demo and ``dimple eval`` share: settings
for a command-line process, ingest (here or through the broker), the
checks a command makes before it searches. (The replay of a logged query
is the API's: ``workers.api.replay_row``.)
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeoutError

from pipeline.audit import lake as audit_lake
from pipeline.contracts import make_query
from pipeline.errors import (
    BrokerUnavailableError,
    IngestTimeoutError,
    InputError,
    NoWorkerError,
    StageError,
    StoreError,
)
from pipeline.store import ingest, segments, writes
from pipeline.store.lake.follow import bases, reader_for
from pipeline.store.maintenance import compact
from pipeline.store.stats import store_stats
from pipeline.store.writes import live_view
from workers import resources
from workers.api import BROKER_DOWN
from workers.app import START_WORKER, consumed_queues, get_app
from workers.celery_compat import stop_waiting
from workers.settings import get_settings


def cli_settings():
    """The process's settings (``get_settings``); logging is set up by ``setup_logging``."""
    return get_settings()


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (a test's capture, a redirect)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


_CONSOLE = "dimple-console"


def log_level(verbose: int, base: int | str = logging.WARNING) -> int:
    """The console level: ``base``, or INFO with one ``-v`` and DEBUG with two, whichever shows more."""
    level = logging.getLevelName(base) if isinstance(base, str) else base
    wanted = (logging.WARNING, logging.INFO, logging.DEBUG)[min(max(verbose, 0), 2)]
    return min(level, wanted)


def setup_logging(level: int) -> None:
    """Log records at ``level`` and above to stderr, once per process (called again, it changes the level).

    Commands log at WARNING (the per-query ``dimple.search`` line and the model
    loader's INFO lines are for ``-v``); ``dimple worker`` and ``dimple flower``
    at ``DIMPLE_LOG_LEVEL``: their log is for operators. Celery's per-task INFO
    lines carry whole batches as results (query text and memories included),
    so below DEBUG the ``celery`` logger shows warnings only, on a worker too.
    """
    root = logging.getLogger()
    if not any(h.get_name() == _CONSOLE for h in root.handlers):
        handler = _Stderr()
        handler.set_name(_CONSOLE)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("celery").setLevel(max(logging.WARNING, level) if level > logging.DEBUG else logging.NOTSET)


def demo_settings(settings):
    """Where ``dimple demo`` keeps its store: ``demo`` under the data dir, apart from the user's."""
    return settings.apart(settings.data_dir / "demo")


def local_settings(settings, what: str, why: str = "its store is built here; the workers serve another"):
    """``settings`` without a broker, saying so on stderr when one was set:
    ``what`` (the demo, a dataset eval, a sweep) runs in this process on
    ``settings.data_dir``. Through the broker it would query the workers'
    store (all-zero figures) and log its queries in their audit log."""
    if settings.embedded:
        return settings
    print(f"dimple: {what} runs embedded, in this process, on the store in {settings.data_dir}: "
          f"DIMPLE_BROKER_URL is not used ({why})", file=sys.stderr, flush=True)
    return settings.replace(broker_url="", result_backend="", broker_password="")


def no_store(settings) -> StoreError:
    """The one message for a data dir without a store, with a hint that is true
    (``dimple demo`` keeps its store apart, in ``demo_settings``'s data dir)."""
    demo = demo_settings(settings)
    if store_exists(demo):
        hint = f"search the demo's with DIMPLE_DATA_DIR={demo.data_dir}"
    else:
        hint = f"'dimple demo' to build the demo's, then search it with DIMPLE_DATA_DIR={demo.data_dir}"
    return StoreError(f"no store in {settings.data_dir}: run 'dimple ingest FILE' to build one, or {hint}")


def store_exists(settings) -> bool:
    """Whether ``settings`` name a store that holds anything yet: a base in
    this host's index path, which a lake's first write builds (a look at the
    folder, without the catalog)."""
    return bool(bases(settings))


def drop_store(settings) -> None:
    """The lake of ``settings`` removed (a demo's or a benchmark's rebuild):
    its catalog, files and bases, only where they lie inside its data dir
    (``demo_settings`` and ``Settings.apart`` keep them there; a lake
    elsewhere, a PostgreSQL catalog, is never touched)."""
    audit_lake.release_all()  # this process's audit connections (this lake's among them)
    folder = settings.data_dir.resolve()
    for path in (settings.lake_data_path, settings.lake_index_path):
        if path.resolve().is_relative_to(folder):
            shutil.rmtree(path, ignore_errors=True)
    catalog = Path(settings.lake_catalog.removeprefix("sqlite:"))
    if settings.lake_catalog.startswith("sqlite:") and catalog.resolve().is_relative_to(folder):
        for name in (catalog.name, f"{catalog.name}-wal", f"{catalog.name}-shm"):
            (catalog.parent / name).unlink(missing_ok=True)


def require_store(settings) -> Path:
    """The published base file; ``no_store`` when there is none (before any model is loaded)."""
    segments.refuse_unmigrated(settings.data_dir)
    built = bases(settings)  # a lake's first write builds its first base
    path = built[max(built)] if built else None
    if path is None:
        raise no_store(settings)
    return path


def check_held(option: str, noun: str, held: list[str], asked: list[str]) -> None:
    """A value of ``option`` (a ``noun``) the store does not hold is a user
    error naming the ones it does (a scope on it could only ever answer nothing)."""
    missing = [a for a in asked if a not in held]
    if not missing:
        return
    shown = ", ".join(repr(n) for n in held[:10])
    more = f" and {len(held) - 10} more ('dimple stats' lists them)" if len(held) > 10 else ""
    holds = f"it holds {shown}{more}" if held else "it holds no memories"
    raise InputError(option, f"no {noun} {missing[0]!r} in the store; {holds}")


def check_namespace(namespaces: list[str], namespace: str | None) -> None:
    """A namespace the store does not hold is a user error naming the ones it does."""
    check_held("--namespace", "namespace", namespaces, [namespace] if namespace is not None else [])


def content_types(snap) -> list[str]:
    """The content types the snapshot's memories have (base and deltas), sorted."""
    if snap.store is None:
        return sorted({m.content_type for m in snap.overlay.members.values()})
    by_type = store_stats(snap.store, snap.overlay)["by_content_type"]
    return sorted(kind for kind, count in by_type.items() if count > 0)


def prepare_search(settings, query: str, options: dict[str, Any]) -> None:
    """Embedded, before the query's clock starts (``make_query`` in ``search``):
    refuse bad input, a missing store, an unknown namespace or content type before any model
    loads, then load what the query will use (the store; the vector index and
    the query embedder when its weights want the vector leg), so process
    start-up and model loading are not counted in ``total_ms``, the stage
    timings or the audit row. Through a broker the workers' store answers,
    which may not be this machine's: only the input is checked here."""
    asked_query = make_query(query, options, settings)
    wants_vectors, at = asked_query.wants("vector"), asked_query.options.as_of
    if not settings.embedded:
        return

    snap = resources.current().snapshot()
    if snap is None:
        raise no_store(settings)
    if at is not None:  # the namespaces the store held then (a snapshot it no longer holds: refused here)
        try:
            snap = resources.current().reader().as_of(at)
        except StoreError as exc:
            raise InputError("--as-of", str(exc)) from None
    check_namespace(snap.namespaces(), options.get("namespace"))
    asked = options.get("content_type") or []
    if asked:
        check_held("--content-type", "content type", content_types(snap), [asked] if isinstance(asked, str) else asked)
    if wants_vectors:
        resources.current().index()
        resources.current().embedder()


def ingest_file(path: Path, settings, *, skip_invalid: bool = False, progress: bool = True,
                forget: list[str] | None = None):
    """Validate ``path`` in full, then write it, and forget ``forget``'s ids,
    as one write (the CLI's ingest); compacts when the deltas passed a threshold."""
    parsed = ingest.read_file(path, settings.limits)
    report = writes.write(settings, parsed, forget=forget, skip_invalid=skip_invalid, progress=progress)
    if report.compact_due:  # no ingest worker compacts for a local write: this process does, now
        report.version = compact(settings, wait=True).version
        report.compacted = True
    return report


def ingest_via_broker(path: Path, settings, *, skip_invalid: bool = False):
    """Check that a worker consumes the ``ingest`` queue, validate the whole
    file here, then send it in batches, in order, to ``ingest.batch``.

    Yields one result dict per batch (``first_line``, ``lines`` and the
    worker's report) as each batch is acknowledged. A batch the worker
    rejects (``ok`` false: nothing of it written) is the last one sent; its
    dict names the lines not sent (``not_sent``). A link to a memory on a
    later batch's line is refused here, before anything is sent. With no
    ingest worker it raises ``NoWorkerError`` and sends nothing. Each batch is waited for
    ``settings.ingest_batch_wait_s``; past that ``IngestTimeoutError`` says
    which lines were sent (that batch stays queued and is applied when a
    worker runs it) and which were not (nothing after it is sent).
    """

    need_broker(settings)
    try:
        if "ingest" not in consumed_queues():
            raise NoWorkerError("ingest", START_WORKER["ingest"])
    except BROKER_DOWN as exc:
        raise BrokerUnavailableError(f"cannot reach the broker: {exc}") from None
    lines = ingest.read_lines(path)  # validated here, then sent as they are, numbered alike
    parsed = ingest.parse_lines(lines, settings.limits)
    size, wait_s = settings.ingest_batch_size, settings.ingest_batch_wait_s
    reader = reader_for(settings)
    try:  # a link to a later batch is refused here: that batch's worker would refuse it, after earlier ones
        with live_view(reader.snapshot()) as live:
            ingest.validate(parsed, live, skip_invalid, batch_size=size)  # type: ignore[arg-type]
    finally:
        reader.close()
    for start in range(0, len(lines), size):
        chunk = lines[start : start + size]
        end = start + len(chunk)
        batch = f"the batch of {_lines(start + 1, end)}"
        rest = f"nothing after it was sent ({_lines(end + 1, len(lines))})" if end < len(lines) else "it was the last"
        try:
            handle = get_app().tasks["ingest.batch"].apply_async(args=[chunk, start + 1, skip_invalid])
        except BROKER_DOWN as exc:
            raise BrokerUnavailableError(f"cannot reach the broker: {exc}") from None
        try:
            result = handle.get(timeout=wait_s)
        except BROKER_DOWN as exc:
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
        if result.get("ok", True):
            yield {"first_line": start + 1, "lines": len(chunk), **result}
            continue
        # the worker refused what was checked here (its settings differ, or a link's target went
        # meanwhile): the batches after it are not sent, so the file is written up to it only
        yield {"first_line": start + 1, "lines": len(chunk), **result,
               **({"not_sent": _lines(end + 1, len(lines))} if end < len(lines) else {})}
        return


def _lines(first: int, last: int) -> str:
    return f"line {first}" if first == last else f"lines {first}-{last}"


def need_broker(settings) -> None:
    if settings.embedded:
        raise InputError("DIMPLE_BROKER_URL", "not set: workers and Flower need a broker (e.g. redis://127.0.0.1:6379/0)")


def snapshot_or_time(text: str) -> int | str:
    """``--as-of``: a snapshot id as an int, anything else as text for the
    query's validation (an ISO time, or an ``InputError`` naming ``as_of``)."""
    return int(text) if text.lstrip("-").isdigit() else text
