"""Dead letters: audit rows whose writes ran out of retries, kept as JSON files
with their error until ``dimple audit retry`` writes them (once each).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.audit.record import AuditRecord
from pipeline.audit.writer import write_record
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


def dead_letters(folder: Path) -> list[tuple[Path, str, AuditRecord]]:
    if not folder.exists():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out.append((path, data["error"], AuditRecord.model_validate(data["record"])))
    return out


def retry_dead_letters(folder: Path, audit_path: Path) -> tuple[int, int, list[str]]:
    """Write every dead letter (idempotently); returns (written, already there, errors)."""
    written = present = 0
    errors = []
    for path, _, record in dead_letters(folder):
        try:
            if write_record(audit_path, record):
                written += 1
            else:
                present += 1
            path.unlink()
        except AuditWriteError as exc:
            errors.append(f"{record.query_id}: {exc}")
    return written, present, errors
