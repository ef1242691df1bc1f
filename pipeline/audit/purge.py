"""Purging the audit trail of a forgotten memory (``dimple audit purge``).

The audit keeps one row per query (``retrieval_log``): the query text (unless
``DIMPLE_STORE_QUERY_TEXT=false``), its options and, per result served, the
memory id with its ranks and scores; never a memory's content. A forgotten
memory can still be read there: its id in the rows that served it, and its
words in query texts that quoted them. ``purge`` deletes every row that holds
one of the given ids or texts anywhere (query text, options, profile, served
ids: an id as a whole value or word, a text ignoring case; never by the
row's own query id), from the log, the outbox and the dead letters.

The rows are deleted from the lake's ``retrieval_log`` in one commit
(``pipeline.audit.lake``): gone from every host's ``dimple audit`` at once.
Their bytes stay in the lake's files and older snapshots until the next
erase (``pipeline.store.lake.erase.purge``: it flushes, rewrites and expires
every table of the lake, this one's included). The outbox and dead letters
purged are this host's.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.audit import lake
from pipeline.audit.lake import LakeLog
from pipeline.audit.letters import OUTBOX_NAME, _put_json
from pipeline.errors import InputError


@dataclass
class PurgeReport:
    rows: int = 0  # retrieval_log rows deleted
    outbox_rows: int = 0  # rows dropped from outbox files
    dead_letters: int = 0  # dead-letter files removed (invalid/ included; and a write's leftover .tmp)


class _Needles:
    """What a row must not hold: a memory id as a whole value or a whole word
    (``m1`` is not in ``m10``), case as written; a text anywhere, ignoring
    case. The row's own ``query_id`` is not searched (a needle such as ``7``
    would match most uuids)."""

    def __init__(self, ids: list[str], texts: list[str]):
        for field, values in (("ids", ids), ("texts", texts)):
            for i, value in enumerate(values):
                if not isinstance(value, str) or not value.strip():
                    raise InputError(f"{field}[{i}]", "must be a non-empty string")
        if not ids and not texts:
            raise InputError("ids", "name at least one memory id or text to purge")
        self.ids = [re.compile(r"(?<![\w.-])" + re.escape(v) + r"(?![\w.-])") for v in ids]
        self.texts = [v.lower() for v in texts]
        self.words = [v.lower() for v in ids] + self.texts  # what every matching row's text contains (``_prefilter``)

    def found_in(self, data: Any) -> bool:
        """Whether any string in ``data`` (a row or letter as JSON data) holds a
        needle: an id in a value or a key (a profile may key by memory id), a
        text in a value only (``--text mode`` is in every row's keys)."""
        for text, is_key in _strings(data):
            if not is_key and any(t in text.lower() for t in self.texts):
                return True
            if any(p.search(text) for p in self.ids):
                return True
        return False


def _strings(data: Any) -> Iterator[tuple[str, bool]]:
    """Every string in JSON data with whether it is a key, ``query_id`` fields left out."""
    if isinstance(data, str):
        yield data, False
    elif isinstance(data, dict):
        for key, value in data.items():
            if key != "query_id":
                yield str(key), True
                yield from _strings(value)
    elif isinstance(data, list):
        for value in data:
            yield from _strings(value)


def purge(log: LakeLog, outbox_dir: Path, dead_letter_dir: Path, ids: list[str],
          texts: list[str] | None = None) -> PurgeReport:
    """Delete every audit row holding one of ``ids`` or ``texts`` (ignoring
    case) from the outbox, the dead letters and the log. Raises
    ``InputError`` when nothing is named."""
    needles = _Needles(list(ids), list(texts or []))
    report = PurgeReport()
    report.outbox_rows = _purge_outbox(outbox_dir, needles)
    report.dead_letters = _purge_letters(dead_letter_dir, needles)
    report.dead_letters += _purge_leftovers([outbox_dir, dead_letter_dir], needles)
    report.rows = _purge_lake(log, needles)
    return report


def _purge_outbox(folder: Path, needles: _Needles) -> int:
    dropped = 0
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if not OUTBOX_NAME.match(path.name):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:  # written meanwhile by its message
            continue
        except ValueError:
            data = None
        records: list[Any] = data.get("records", []) if isinstance(data, dict) else []
        keep = [r for r in records if not needles.found_in(r)]
        if data is None or not keep:
            dropped += len(records)
            path.unlink(missing_ok=True)
        elif len(keep) < len(records) and path.exists():  # not taken by its message meanwhile
            dropped += len(records) - len(keep)
            _put_json(path, {**data, "records": keep})
    return dropped


# A file is written whole or not at all, through ``NAME.tmp`` renamed over it
# (``letters._put_json``): a ``.tmp`` this old belongs to a process that died in between.
LEFTOVER_S = 60.0


def _purge_leftovers(folders: list[Path], needles: _Needles) -> int:
    """The ``*.tmp`` files a process that died while writing one left (an
    outbox file, a dead letter) holding a needle, removed; how many."""
    cutoff = time.time() - LEFTOVER_S  # younger: being written now, renamed over its file in a moment
    return sum(_purge_files(folder, "*.tmp", needles, written_before=cutoff) for folder in folders)


def _purge_letters(folder: Path, needles: _Needles) -> int:
    return _purge_files(folder, "*.json", needles)


def _purge_files(folder: Path, pattern: str, needles: _Needles, written_before: float | None = None) -> int:
    """The files under ``folder`` matching ``pattern`` (last written before
    ``written_before``, a time) that hold a needle, removed; how many."""
    removed = 0
    for path in sorted(folder.rglob(pattern)) if folder.is_dir() else []:
        try:
            if written_before is not None and path.stat().st_mtime > written_before:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        try:
            data: Any = json.loads(text)
        except ValueError:
            data = text  # not JSON (a damaged letter): searched as text
        if needles.found_in(data):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


_ROWS = ("SELECT query_id, query_text, options::VARCHAR, query_profile::VARCHAR, sources::VARCHAR, "
         "truncation::VARCHAR FROM retrieval_log")


def _row_data(row: tuple) -> list[Any]:
    """A log row's searchable fields as JSON data (its JSON columns parsed)."""
    out: list[Any] = [row[1]]
    for text in row[2:]:
        try:
            out.append(json.loads(text) if text is not None else None)
        except ValueError:
            out.append(text)
    return out


_TEXT = ("lower(concat_ws(' ', query_text, options::VARCHAR, query_profile::VARCHAR, sources::VARCHAR, "
         "truncation::VARCHAR))")


def _prefilter(needles: _Needles) -> tuple[str, list[str]]:
    """A WHERE clause that every row holding a needle passes, so that only
    those rows are read into Python and checked whole (``found_in``); none (every
    row read) when a needle may be spelled otherwise in the stored JSON: a
    quote, a backslash, a control or non-ASCII character (escaped there)."""
    if any(ch in '"\\' or not " " <= ch <= "~" for word in needles.words for ch in word):
        return "", []
    return " WHERE " + " OR ".join([f"contains({_TEXT}, ?)"] * len(needles.words)), list(needles.words)


def _purge_lake(log: LakeLog, needles: _Needles) -> int:
    where, params = _prefilter(needles)
    with lake.reading(log) as cur:
        if cur is None:
            return 0
        doomed = [row[0] for row in cur.execute(_ROWS + where, params).fetchall() if needles.found_in(_row_data(row))]
    return lake.delete(log, doomed)


