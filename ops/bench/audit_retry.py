"""``dimple audit retry`` of a dead-letter backlog: batched transactions
against one write per letter (the path before), in one run.

    python -m ops.bench.audit_retry --n 10000 --baseline-n 1000

Both sides write the same rows into a fresh lake of their own (SQLite
catalog); the baseline (``write_record`` per letter, a commit each)
runs on ``--baseline-n`` letters and its time is scaled to ``--n`` (it is
linear in the letters), so the ratio is per letter.

It also retries one batch (``RETRY_BATCH`` letters) of which one letter
fails to write: ``retry_dead_letters`` halves a failing batch down to that
letter. The path before wrote each letter of a failing batch on its own; its
time is the one-by-one time per letter times the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import datetime
from pathlib import Path

from pipeline.audit import (
    AuditRecord,
    LakeLog,
    count,
    dead_letter,
    dead_letters,
    letters,
    log_of,
    retry_dead_letters,
    write_record,
)
from pipeline.errors import AuditStoreUnavailable


def _row(i: int) -> AuditRecord:
    return AuditRecord(
        query_id=f"{i:032x}", logged_at=datetime(2026, 1, 1), query_hash="0" * 16, hash_of="text", mode="hybrid",
        requested_mode="hybrid", query_text=f"deploy window {i}", options={"scope": {}, "budget": {"max_units": 10}},
        query_profile={"legs": {"fts": {"ran": True, "hits": 10}, "vector": {"ran": True, "hits": 10}}},
        sources=[{"id": f"m{j}", "rank": j, "ranks": {"fts": j}, "rrf": 0.01, "score": 0.01} for j in range(1, 11)],
        result_count=10, truncated=False, latency_ms={"embed": 10.0}, total_ms=50.0, rrf_k=60,
    )


def _log(folder: Path) -> LakeLog:
    from pipeline.settings import Settings

    return log_of(Settings(data_dir=folder, _env_file=None))


def _poisoned_batch(work: Path) -> float:
    """Seconds to retry ``RETRY_BATCH`` letters of which the middle one fails."""
    n = letters.RETRY_BATCH
    for i in range(n):
        dead_letter(work / "letters", _row(i), "bench")
    poison = _row(n // 2).query_id
    real = letters.write_records

    def failing(path, records):
        if any(r.query_id == poison for r in records):
            raise AuditStoreUnavailable("the poisoned letter's transaction fails")
        return real(path, records)

    letters.write_records = failing
    try:
        t0 = time.perf_counter()
        written, present, errors = retry_dead_letters(work / "letters", _log(work / "lake"))
        took = time.perf_counter() - t0
    finally:
        letters.write_records = real
    assert (written, present, len(errors)) == (n - 1, 0, 1), (written, present, errors)
    return took


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.bench.audit_retry")
    p.add_argument("--n", type=int, default=10_000, help="dead letters retried in batches")
    p.add_argument("--baseline-n", type=int, default=1_000, help="dead letters written one by one")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for i in range(args.n):
            dead_letter(work / "letters", _row(i), "bench")
        t0 = time.perf_counter()
        batched_log, one_log = _log(work / "batched"), _log(work / "one-lake")
        written, present, errors = retry_dead_letters(work / "letters", batched_log)
        batched = time.perf_counter() - t0
        assert (written, present, errors) == (args.n, 0, []) and count(batched_log)[0] == args.n
        for i in range(args.baseline_n):
            dead_letter(work / "one", _row(i), "bench")
        t0 = time.perf_counter()
        for _, _, record in dead_letters(work / "one"):
            write_record(one_log, record)
        per_letter = (time.perf_counter() - t0) / args.baseline_n
        one_by_one = per_letter * args.n
        poisoned = _poisoned_batch(work / "poisoned")
    print(json.dumps({
        "load_average": os.getloadavg(),
        "letters": args.n,
        "batched_s": round(batched, 2),
        "one_by_one_s_scaled": round(one_by_one, 2),
        "ratio_batched_over_one_by_one": round(batched / one_by_one, 4),
        "poisoned_batch_letters": letters.RETRY_BATCH,
        "poisoned_batch_halving_s": round(poisoned, 2),
        "poisoned_batch_letter_by_letter_s_scaled": round(per_letter * letters.RETRY_BATCH, 2),
        "ratio_halving_over_letter_by_letter": round(poisoned / (per_letter * letters.RETRY_BATCH), 4),
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
