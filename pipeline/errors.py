"""Typed errors. A user's mistake is one of these, never a stack trace."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def problems(exc: Any, default: str = "") -> list[tuple[str, str, str]]:
    """A pydantic ``ValidationError``'s problems as (dotted field path, message,
    error type), in pydantic's order: the one place such an error becomes field names."""
    return [(".".join(str(p) for p in err["loc"]) or default, err["msg"], err["type"]) for err in exc.errors()]


def one_line(text: str) -> str:
    """An error message as one printable line: line breaks, control and
    bidirectional characters and invalid Unicode (from non-UTF-8 arguments)
    are written as escapes, so a hostile value cannot break or disguise it."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class DimpleError(Exception):
    """Base of every error dimple raises on purpose."""


class InputError(DimpleError, ValueError):
    """Bad input from a caller; ``field`` names what was wrong."""

    def __init__(self, field: str, reason: str):
        self.field = field
        self.reason = reason
        # ``args`` is what Celery sends (JSON) and rebuilds the error from on
        # the caller's side (``cls(*args)``): the error raised on a worker
        # reaches the caller as itself, with its field
        super().__init__(field, reason)

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


@dataclass
class LineError:
    """One problem on one line of an ingest file."""

    line: int
    field: str
    reason: str
    unit: str = "line"  # "record" for records given to ``remember``, numbered from 1

    def __str__(self) -> str:
        return f"{self.unit} {self.line}: {self.field}: {self.reason}"


@dataclass
class IngestValidationError(DimpleError):
    """An ingest file had bad lines; nothing was written."""

    errors: list[LineError] = field(default_factory=list)

    def __str__(self) -> str:
        unit = self.errors[0].unit if self.errors else "line"
        head = f"{len(self.errors)} invalid {unit}(s); nothing was written"
        shown = "\n".join(f"  {one_line(str(e))}" for e in self.errors[:50])  # field names come from the file
        more = f"\n  ... and {len(self.errors) - 50} more" if len(self.errors) > 50 else ""
        return f"{head}\n{shown}{more}"


class StoreError(DimpleError):
    """The store cannot be opened or used (missing, newer schema, other model)."""


class ModelMismatchError(InputError, StoreError):
    """Vectors of one embedding model offered to a store that holds another's
    (``pipeline.embedders.check_model``); ``field`` is the setting to change."""


class SchemaTooNewError(StoreError):
    """The store was written by a newer dimple than this one."""


class VersionNotReachedError(InputError):
    """A search's ``min_version`` was not reached by the store within
    ``store.min_version_wait_ms``; ``field`` is ``min_version``."""

    def __init__(self, wanted: int, seen: int | None, waited_ms: float):
        self.wanted, self.seen = wanted, seen
        super().__init__("min_version", f"the store is at version {seen if seen is not None else 'none (empty)'}, "
                                        f"not {wanted}, after waiting {waited_ms:.0f} ms "
                                        "(store.min_version_wait_ms)")
        self.args = (wanted, seen, waited_ms)  # what Celery sends and rebuilds it from: typed on the caller's side too


class QueryTimeoutError(DimpleError):
    """No answer from the workers within the caller's timeout."""


class BrokerUnavailableError(DimpleError):
    """The configured broker cannot be reached."""


class StageLostError(BrokerUnavailableError):
    """The broker lost a query's queued stages (it restarted without its data,
    or was flushed): the query can never be answered and may be sent again."""


class NoWorkerError(DimpleError):
    """No live worker consumes a queue a command needs; ``queue`` names it and
    the message the command that starts one."""

    def __init__(self, queue: str, start: str, detail: str = "nothing was sent"):
        self.queue = queue
        super().__init__(f"no worker is consuming the {queue!r} queue ({detail}); start one: {start}")


class IngestTimeoutError(QueryTimeoutError):
    """A write sent through the broker (an ingest batch, ``remember``, ``forget``)
    was not acknowledged in time: it stays queued and may still be applied."""


class StageError(DimpleError):
    """A pipeline stage failed on a worker; the message names the stage and the cause."""


class AuditWriteError(DimpleError):
    """An audit row could not be written."""


class AuditStoreUnavailable(AuditWriteError):
    """The audit store cannot be opened or written (lock, permissions, disk)."""


class AuditRetriesExhausted(AuditWriteError):
    """Every retry failed; the row went to the dead-letter folder."""


class EvalInputError(InputError):
    """A bad evaluation input: names the file, line and field."""

    def __init__(self, where: str, reason: str):
        super().__init__(where, reason)


class EvalFailed(DimpleError):
    """Every query of a run failed (broker down, timeouts): nothing to score."""
