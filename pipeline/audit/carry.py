"""The audit trail of the segment store of earlier versions, carried into the
lake: ``audit.duckdb`` (``Settings.audit_path``) read in pages by query id and
written into the lake's ``retrieval_log`` (``pipeline.audit.lake``), exactly
once by query id, so ``dimple migrate`` run again carries nothing twice, and
``dimple audit`` (explain, replay) reads the rows the old store logged. A
row's ``store_version`` was the segment store's, not a lake snapshot: it is
kept as ``segment_version``, so a replay runs at the lake's latest snapshot
and says so (``explain.store_changed``) instead of reading whatever lake
snapshot bears that number. The file itself is left for the operator to
remove, as the segment store is."""

from __future__ import annotations

from pathlib import Path

import duckdb

from pipeline.audit.lake import LakeLog
from pipeline.audit.reader import rows_of
from pipeline.audit.record import COLUMNS, AuditRecord
from pipeline.audit.writer import write_records
from pipeline.errors import AuditStoreUnavailable

PAGE = 1000  # rows a read and a lake commit take


def carry(path: Path, log: LakeLog, size: int = PAGE) -> tuple[int, int]:
    """Every row of the audit file ``path`` written into ``log`` (none when there
    is no file); (rows read, rows the lake did not hold yet)."""
    read = written = 0
    after: str | None = None
    while rows := page(path, after, size):
        read += len(rows)
        written += write_records(log, [_as_carried(r) for r in rows])
        after = rows[-1].query_id
    return read, written


def page(path: Path, after: str | None, limit: int) -> list[AuditRecord]:
    """Up to ``limit`` rows of the audit file ``path`` whose query ids sort
    after ``after`` (from the first when None), by query id; none when there
    is no file or it holds no ``retrieval_log`` (its writer stopped before the
    schema committed). Opened read-only: an earlier dimple's audit worker
    still writing it makes this fail (``AuditStoreUnavailable``), never wait."""
    if not path.exists():
        return []
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        raise AuditStoreUnavailable(f"cannot read the audit store {path}: {exc}") from None
    try:
        if not con.execute("SELECT count(*) FROM information_schema.tables "
                           "WHERE table_name = 'retrieval_log'").fetchall()[0][0]:
            return []
        where, params = ("WHERE query_id > ? ", [after]) if after is not None else ("", [])
        return rows_of(con, f"SELECT {', '.join(COLUMNS)} FROM retrieval_log {where}ORDER BY query_id LIMIT ?",
                       [*params, limit])
    finally:
        con.close()


def _as_carried(record: AuditRecord) -> AuditRecord:
    profile = dict(record.query_profile)
    if "store_version" in profile:
        profile["segment_version"] = profile.pop("store_version")
    return record.model_copy(update={"query_profile": profile})
