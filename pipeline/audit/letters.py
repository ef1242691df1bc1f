"""Audit rows kept as JSON files until they are in the log:

- the **outbox**: every row a worker answered a query with, written to disk
  before the answer goes back and before ``audit.write`` is sent, removed
  once the row is in ``retrieval_log`` (or dead-lettered). Rows whose
  message was lost (Redis restarted without its data, or the audit worker
  died and its message with it) are written from here by the audit worker
  (``drain_outbox``), so a row once answered is never lost and, the log
  being keyed by query id, never written twice;
- **dead letters**: rows whose writes ran out of retries, with their error,
  until ``dimple audit retry`` writes them (once each).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipeline.audit.lake import LakeLog
from pipeline.audit.record import AuditRecord
from pipeline.audit.writer import check_writable, write_records
from pipeline.errors import AuditWriteError, problems
from pipeline.folders import private_dir

log = logging.getLogger("dimple.audit")


def _put_json(path: Path, data: Any) -> Path:
    """Write ``data`` to ``path`` whole or not at all (a temporary file renamed over it)."""
    tmp = path.with_name(path.name + ".tmp")
    # ensure_ascii: a lone surrogate in the payload is written as an escape, not refused
    tmp.write_text(json.dumps(data, default=repr), encoding="utf-8")
    tmp.replace(path)
    return path


# -- outbox ---------------------------------------------------------------------------
OUTBOX_NAME = re.compile(r"^[0-9]{20}-[0-9a-f]{32}\.json$")  # <time ns>-<uuid>.json: oldest sorts first


def outbox_put(folder: Path, payload: list[dict]) -> str:
    """Keep one ``audit.write`` payload in the outbox; returns its file name
    (what the message carries so the writer can remove it)."""
    private_dir(folder)
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex}.json"
    _put_json(folder / name, {"records": payload})
    return name


def outbox_done(folder: Path, name: Any) -> None:
    """Remove an outbox file once its rows are in the log (or dead-lettered).
    ``name`` comes from a message: anything but an outbox file name is ignored."""
    if isinstance(name, str) and OUTBOX_NAME.match(name):
        (folder / name).unlink(missing_ok=True)


def outbox_pending(folder: Path, older_than_s: float = 0.0) -> list[Path]:
    """Outbox files at least ``older_than_s`` old, oldest first."""
    if not folder.exists():
        return []
    cutoff = time.time() - older_than_s
    out = []
    for path in sorted(folder.iterdir()):
        if not OUTBOX_NAME.match(path.name):
            continue
        try:
            if path.stat().st_mtime <= cutoff:
                out.append(path)
        except FileNotFoundError:  # written meanwhile by its message
            continue
    return out


def _read_outbox(path: Path, dead_letter_dir: Path) -> list[AuditRecord] | None:
    """The rows of one outbox file; None when it is gone (written meanwhile by
    its message) or cannot be read as rows (quarantined with the field named)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [AuditRecord.model_validate(r) for r in data["records"]]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        where = _what_was_wrong(exc)
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None
        kept = quarantine(dead_letter_dir, text, f"outbox file {path.name}: {where}")
        log.error("audit outbox file %s cannot be read as rows (%s); kept in %s", path.name, where, kept)
        path.unlink(missing_ok=True)
        return None


def outbox_rows(folder: Path, dead_letter_dir: Path, name: str) -> list[AuditRecord] | None:
    """The rows the outbox file ``name`` keeps now (a purge may have taken some);
    None when it is gone: written, dead-lettered or purged whole."""
    return _read_outbox(folder / name, dead_letter_dir) if OUTBOX_NAME.match(name) else None


def outbox_batch(folder: Path, dead_letter_dir: Path, rows: int, skip: Collection[str] = ()
                 ) -> list[tuple[Path, list[AuditRecord]]]:
    """The outbox files waiting now (any age, oldest first, those named in ``skip`` left out)
    up to about ``rows`` rows, with their rows: what an ``audit.write`` writes
    with its own rows, in the same transaction (issue 33: the audit worker's
    cost is per batch, not per message)."""
    out: list[tuple[Path, list[AuditRecord]]] = []
    taken = 0
    for path in outbox_pending(folder):
        if taken >= rows:
            break
        if path.name in skip:
            continue
        records = _read_outbox(path, dead_letter_dir)
        if records is not None:
            out.append((path, records))
            taken += len(records)
    return out


# The file naming an outbox (one per audit dir, i.e. per host): a message
# carries it, so an audit worker knows whether the message's outbox file is
# one of its own host's (and gone means written), or another host's.
OUTBOX_ID = ".outbox-id"
_IDS: dict[Path, str] = {}


def outbox_id(folder: Path) -> str:
    """This outbox's id, made by the first process that asks (kept in ``OUTBOX_ID``)."""
    known = _IDS.get(folder)
    if known is not None:
        return known
    path = folder / OUTBOX_ID
    if not path.exists():
        private_dir(folder)
        fresh = path.with_name(f"{OUTBOX_ID}.{uuid.uuid4().hex}")
        fresh.write_text(uuid.uuid4().hex, encoding="utf-8")
        try:
            os.link(fresh, path)  # never over another process's id
        except FileExistsError:
            pass
        finally:
            fresh.unlink(missing_ok=True)
    _IDS[folder] = path.read_text(encoding="utf-8").strip()
    return _IDS[folder]


def drain_outbox(folder: Path, dead_letter_dir: Path, write: Callable[[list[AuditRecord]], int],
                 older_than_s: float = 0.0, batch: int = 1000) -> tuple[int, int]:
    """Write the rows of the outbox files at least ``older_than_s`` old, about
    ``batch`` rows per ``write`` (idempotent by query id), removing each file
    once its rows are in; returns (files, rows inserted). A file that cannot
    be read as rows is quarantined (``dead_letter_dir/invalid``) with the
    field named; an ``AuditWriteError`` stops the drain (the files stay)."""
    files = inserted = 0
    chunk: list[Path] = []
    rows: list[AuditRecord] = []

    def flush() -> None:
        nonlocal files, inserted
        if rows:
            inserted += write(rows)
        for path in chunk:
            path.unlink(missing_ok=True)
        files += len(chunk)
        chunk.clear()
        rows.clear()

    for path in outbox_pending(folder, older_than_s):
        records = _read_outbox(path, dead_letter_dir)
        if records is None:
            continue
        chunk.append(path)
        rows.extend(records)
        if len(rows) >= batch:
            flush()
    flush()
    return files, inserted



# -- dead letters -------------------------------------------------------------------
def dead_letter(folder: Path, record: AuditRecord, error: str) -> Path:
    """Keep a row whose retries ran out, with the error, for ``dimple audit retry``."""
    private_dir(folder)
    return _put_json(folder / f"{record.query_id}.json", {"error": error, "record": record.model_dump(mode="json")})


def quarantine(folder: Path, payload: Any, error: str) -> Path:
    """Keep a malformed audit row as it came (it cannot be written, so
    ``dimple audit retry`` does not read it) in ``folder/invalid``, with the
    field that was wrong."""
    target = folder / "invalid"
    private_dir(target)
    if isinstance(payload, str):  # a file's text: kept as the JSON it holds where it is JSON, so that a
        try:  # purge reads its strings (in the text, JSON's \u escapes would hide a non-ASCII id or word)
            payload = json.loads(payload)
        except ValueError:
            pass
    return _put_json(target / f"{uuid.uuid4().hex}.json", {"error": error, "payload": payload})


def dead_letters(folder: Path) -> list[tuple[Path, str, AuditRecord]]:
    """The dead letters that read as audit rows: (path, error, row), by name."""
    return scan_dead_letters(folder)[0]


def scan_dead_letters(folder: Path) -> tuple[list[tuple[Path, str, AuditRecord]], list[tuple[Path, str]]]:
    """Every dead letter in ``folder``, by name: those that read as audit rows,
    and those that do not (edited by hand) with the field that was wrong. A
    letter removed while the folder is read (written by another retry) is
    left out."""
    rows, unreadable = [], []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            rows.append(_read_letter(path))
        except FileNotFoundError:
            continue
        except (ValueError, KeyError, TypeError) as exc:
            unreadable.append((path, _what_was_wrong(exc)))
    return rows, unreadable


def _read_letter(path: Path) -> tuple[Path, str, AuditRecord]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return path, data["error"], AuditRecord.model_validate(data["record"])


def _what_was_wrong(exc: Exception) -> str:
    """The field and problem of a file that does not read as audit rows."""
    return "{}: {}".format(*problems(exc, "record")[0][:2]) if isinstance(exc, ValidationError) else repr(exc)


def _readable_letters(folder: Path, errors: list[str]) -> list[tuple[Path, str, AuditRecord]]:
    """``dead_letters`` for ``retry_dead_letters``: a letter that no longer
    reads as a row is moved to ``invalid/`` with the field that was wrong and
    reported in ``errors``; the others are still written."""
    rows, unreadable = scan_dead_letters(folder)
    for path, where in unreadable:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:  # removed meanwhile
            continue
        kept = quarantine(folder, text, f"dead letter {path.name}: {where}")
        path.unlink(missing_ok=True)
        errors.append(f"{path.name}: not an audit row ({where}); moved to {kept}")
    return rows


RETRY_BATCH = 1000  # dead letters written per transaction by ``retry_dead_letters``


def retry_dead_letters(folder: Path, log: LakeLog, batch: int = RETRY_BATCH) -> tuple[int, int, list[str]]:
    """Write every dead letter (idempotently); returns (written, already there, errors).

    ``batch`` letters go in one transaction over one connection. When a batch
    fails, the store is opened alone: if that fails too, the store is down and
    no letter is tried again (each is reported with the store's error);
    otherwise a letter is at fault, and the batch is split in halves, each
    tried again, down to single letters. One bad letter keeps only itself
    back, for about 2 x log2(batch) more transactions. A letter is removed once
    its row is in the log.
    """
    retry = _Retry(log)
    letters = _readable_letters(folder, retry.errors)
    for start in range(0, len(letters), batch):
        retry.write(letters[start : start + batch])
    return retry.written, retry.present, retry.errors


@dataclass
class _Retry:
    log: LakeLog
    written: int = 0
    present: int = 0
    errors: list[str] = field(default_factory=list)
    down: AuditWriteError | None = None  # the store's own error, once it would not open

    def write(self, chunk: list[tuple[Path, str, AuditRecord]]) -> None:
        # letters a purge (or another retry) removed since they were read are not written back
        chunk = [letter for letter in chunk if letter[0].exists()]
        if not chunk:
            return
        if self.down is not None:
            self.errors.extend(f"{record.query_id}: {self.down}" for _, _, record in chunk)
            return
        try:
            inserted = write_records(self.log, [record for _, _, record in chunk])
        except AuditWriteError as exc:
            if len(chunk) == 1:
                self.errors.append(f"{chunk[0][2].query_id}: {exc}")
                return
            try:
                check_writable(self.log)
            except AuditWriteError as down:
                self.down = down
                self.write(chunk)
                return
            half = len(chunk) // 2
            self.write(chunk[:half])
            self.write(chunk[half:])
            return
        self.written += inserted
        self.present += len(chunk) - inserted
        for path, _, _ in chunk:
            path.unlink(missing_ok=True)  # a purge, or another retry, may have removed it meanwhile
