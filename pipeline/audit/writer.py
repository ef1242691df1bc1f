"""Writing audit rows: each batch one lake commit (``pipeline.audit.lake``),
exactly once by query id, so a redelivered ``audit.write`` never adds a row."""

from __future__ import annotations

from pipeline.audit import lake
from pipeline.audit.lake import LakeLog
from pipeline.audit.record import AuditRecord


def write_records(log: LakeLog, records: list[AuditRecord]) -> int:
    """Insert the rows whose query ids the log does not hold yet, in one
    commit; how many were inserted. Raises ``AuditStoreUnavailable``."""
    return lake.write(log, records) if records else 0


def write_record(log: LakeLog, record: AuditRecord) -> bool:
    """``write_records`` for one row: True when it was inserted."""
    return write_records(log, [record]) == 1


def check_writable(log: LakeLog) -> None:
    """Attach the lake and create the audit tables if need be, as a write
    does; ``AuditStoreUnavailable`` when that fails."""
    lake.check_writable(log)
