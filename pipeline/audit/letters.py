"""Dead letters: audit rows whose writes ran out of retries, kept as JSON files
with their error until ``dimple audit retry`` writes them (once each).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from pipeline.audit.record import AuditRecord
from pipeline.audit.writer import write_record, write_records
from pipeline.errors import AuditWriteError


# -- dead letters -------------------------------------------------------------------
def dead_letter(folder: Path, record: AuditRecord, error: str) -> Path:
    """Keep a row whose retries ran out, with the error, for ``dimple audit retry``."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{record.query_id}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"error": error, "record": record.model_dump(mode="json")}), encoding="utf-8")
    tmp.replace(path)
    return path


def quarantine(folder: Path, payload: Any, error: str) -> Path:
    """Keep a malformed audit row as it came (it cannot be written, so
    ``dimple audit retry`` does not read it) in ``folder/invalid``, with the
    field that was wrong."""
    target = folder / "invalid"
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = target / f"{uuid.uuid4().hex}.json"
    tmp = path.with_suffix(".tmp")
    # ensure_ascii: a lone surrogate in the payload is written as an escape, not refused
    tmp.write_text(json.dumps({"error": error, "payload": payload}, default=repr), encoding="utf-8")
    tmp.replace(path)
    return path


def dead_letters(folder: Path) -> list[tuple[Path, str, AuditRecord]]:
    if not folder.exists():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out.append((path, data["error"], AuditRecord.model_validate(data["record"])))
    return out


RETRY_BATCH = 1000  # dead letters written per transaction by ``retry_dead_letters``


def retry_dead_letters(folder: Path, audit_path: Path, batch: int = RETRY_BATCH) -> tuple[int, int, list[str]]:
    """Write every dead letter (idempotently); returns (written, already there, errors).

    ``batch`` letters go in one transaction over one connection; a batch that
    fails is retried one letter at a time, so one bad letter keeps only itself
    back. A letter is removed once its row is in the log.
    """
    written = present = 0
    errors: list[str] = []
    letters = dead_letters(folder)
    for start in range(0, len(letters), batch):
        chunk = letters[start : start + batch]
        try:
            inserted = write_records(audit_path, [record for _, _, record in chunk])
        except AuditWriteError:
            for path, _, record in chunk:
                try:
                    if write_record(audit_path, record):
                        written += 1
                    else:
                        present += 1
                    path.unlink()
                except AuditWriteError as exc:
                    errors.append(f"{record.query_id}: {exc}")
            continue
        written += inserted
        present += len(chunk) - inserted
        for path, _, _ in chunk:
            path.unlink()
    return written, present, errors
