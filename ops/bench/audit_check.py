"""An audit write as the log grows: the check that keeps a row sent again
from being stored twice, asked within the batch's ``logged_at`` span (what
``pipeline.audit.lake.write`` asks) against by query id alone (the check
before), on the same lake, alternated; then whole writes at the two sizes.

    python -m ops.bench.audit_check --work /tmp/audit-check --writes 400 2000 --rows 75

Each size is a lake (SQLite catalog) of ``--writes`` commits of ``--rows``
rows, each commit a minute after the one before (as a stream of queries
writes them); the checks ask for a batch of ``--rows`` new query ids
logged after the last commit. A check's cost should not grow with the log:
``ratio`` is the check by id alone over the windowed one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

from ops.bench import emit
from pipeline.audit import AuditRecord, log_of, write_records
from pipeline.audit.lake import _CONNECTIONS
from pipeline.settings import Settings

START = datetime(2026, 1, 1)


def _row(i: int, at: datetime) -> AuditRecord:
    return AuditRecord(query_id=uuid.uuid4().hex, logged_at=at, query_hash=f"{i:016x}", hash_of="text",
                       mode="keyword", requested_mode="keyword", query_text=f"query {i}", options={},
                       query_profile={}, sources=[], result_count=0, truncated=False, total_ms=1.0, rrf_k=60)


def _checks(cur, ids: list[str], first: str, last: str, repeats: int) -> dict:
    by_id = "SELECT query_id FROM retrieval_log WHERE query_id IN (SELECT unnest(?))"
    windowed = ("SELECT query_id FROM retrieval_log WHERE logged_at BETWEEN ?::TIMESTAMP AND ?::TIMESTAMP "
                "AND query_id IN (SELECT unnest(?))")
    times: dict[str, list[float]] = {"by_id": [], "windowed": []}
    for _ in range(repeats):
        for name, sql, params in (("by_id", by_id, [ids]), ("windowed", windowed, [first, last, ids])):
            t0 = time.perf_counter()
            assert cur.execute(sql, params).fetchall() == []
            times[name].append((time.perf_counter() - t0) * 1000)
    out = {k: round(statistics.median(v), 2) for k, v in times.items()}
    out["ratio"] = round(out["by_id"] / out["windowed"], 2)
    return out


def run(work: Path, sizes: list[int], rows: int, repeats: int) -> dict:
    out: dict = {"rows_per_write": rows, "load_before": list(os.getloadavg()), "sizes": {}}
    for writes in sizes:
        log = log_of(Settings(data_dir=work / f"log-{writes}", _env_file=None))
        t0 = time.perf_counter()
        for w in range(writes):
            at = START + timedelta(minutes=w)
            write_records(log, [_row(w * rows + i, at + timedelta(milliseconds=i)) for i in range(rows)])
        built = time.perf_counter() - t0
        after = START + timedelta(minutes=writes)
        batch = [_row(10**9 + i, after + timedelta(milliseconds=i)) for i in range(rows)]
        first, last = (r.model_dump(mode="json", include={"logged_at"})["logged_at"] for r in (batch[0], batch[-1]))
        cur = _CONNECTIONS.cursor(log, create=False)
        try:
            check = _checks(cur, [r.query_id for r in batch], first, last, repeats)
        finally:
            cur.close()
        write_ms = []
        for k in range(5):  # whole writes, as the audit writer does them
            more = [_row(2 * 10**9 + k * rows + i, after + timedelta(seconds=k + 1, milliseconds=i)) for i in range(rows)]
            t0 = time.perf_counter()
            write_records(log, more)
            write_ms.append((time.perf_counter() - t0) * 1000)
        out["sizes"][writes] = {"rows_in_log": writes * rows, "build_s": round(built, 1), "check_ms": check,
                                "write_ms_p50": round(statistics.median(write_ms), 1)}
    out["load_after"] = list(os.getloadavg())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.audit_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True, help="a folder for the lakes (made anew: must not exist)")
    p.add_argument("--writes", type=int, nargs="+", default=[400, 2000], help="commits in each log")
    p.add_argument("--rows", type=int, default=75, help="rows a commit (and a check's batch)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.work.exists():
        p.error(f"--work: {args.work} exists; name a folder to make")
    args.work.mkdir(parents=True)
    emit(run(args.work, args.writes, args.rows, args.repeats), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
