"""Load the LoCoMo benchmark (``locomo10.json``) as ingest records, queries and qrels.

One memory per dialogue turn, one namespace per conversation, one query per
scored question. The protocol follows the data's README: each question is
searched in its own conversation's namespace, its evidence turns are the
relevant memories (grade 1), and category 5 (adversarial) is not scored.

The file itself is evaluation data under CC BY-NC 4.0: read it where it lies,
never copy it into the project.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = ["LocomoSet", "load_locomo", "parse_session_datetime", "write_locomo_jsonl"]

ADVERSARIAL_CATEGORY = 5

_MONTHS = {
    name: number
    for number, name in enumerate(
        ("january", "february", "march", "april", "may", "june", "july",
         "august", "september", "october", "november", "december"),
        start=1,
    )
}
# "1:56 pm on 8 May, 2023"; parsed by hand because strptime's %B and %p follow the locale.
_DATE_TIME = re.compile(
    r"^\s*(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*$", re.IGNORECASE
)
_SESSION = re.compile(r"^session_(\d+)$")
# Evidence ids are "D<session>:<turn>"; an entry may join several with ";" and,
# in a few questions, with plain spaces. No id contains either separator.
_EVIDENCE_SPLIT = re.compile(r"[;\s]+")
# A handful of ids carry typos ("D:11:26", "D30:05"); their turns exist as
# "D11:26" and "D30:5" and match the questions, so an id that names no turn is
# retried in this canonical form before it is dropped.
_EVIDENCE_LOOSE = re.compile(r"^D:?(\d+):(\d+)$")


@dataclass
class LocomoSet:
    """Everything one LoCoMo file yields for retrieval evaluation.

    ``repaired_evidence_ids`` counts evidence ids that named no turn as
    written but did once canonicalised (``D:11:26`` -> ``D11:26``,
    ``D30:05`` -> ``D30:5``).

    ``skipped`` counts what was left out and why:
    ``adversarial`` (category-5 questions), ``no_evidence`` (questions whose
    evidence list is empty), ``unknown_evidence_only`` (questions whose every
    evidence id names no turn), and ``unknown_evidence_ids`` (evidence ids
    dropped because no turn has that id, even canonicalised; this one counts
    ids, not questions).
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    queries: list[dict[str, Any]] = field(default_factory=list)
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    repaired_evidence_ids: int = 0


def parse_session_datetime(text: str) -> datetime:
    """``'1:56 pm on 8 May, 2023'`` -> ``datetime(2023, 5, 8, 13, 56, tzinfo=UTC)``.

    The data carries no zone; it is read as UTC. Raises ``ValueError`` on
    anything else.
    """
    match = _DATE_TIME.match(text)
    if not match:
        raise ValueError(f"unrecognised LoCoMo session date time: {text!r}")
    hour, minute, half, day, month_name, year = match.groups()
    month = _MONTHS.get(month_name.lower())
    hour_i = int(hour)
    if month is None or not 1 <= hour_i <= 12:
        raise ValueError(f"unrecognised LoCoMo session date time: {text!r}")
    hour_24 = hour_i % 12 + (12 if half.lower() == "p" else 0)
    return datetime(int(year), month, int(day), hour_24, int(minute), tzinfo=UTC)


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sessions(conversation: dict[str, Any]) -> Iterator[tuple[int, list[dict[str, Any]], datetime]]:
    """(number, turns, start) for every session, in session order."""
    numbers = sorted(int(m.group(1)) for key in conversation if (m := _SESSION.match(key)))
    for number in numbers:
        turns = conversation[f"session_{number}"]
        stamp = conversation.get(f"session_{number}_date_time")
        if not isinstance(turns, list):
            raise ValueError(f"session_{number} is not a list of turns")
        if not turns:
            continue
        if not isinstance(stamp, str):
            raise ValueError(f"session_{number} has turns but no session_{number}_date_time")
        yield number, turns, parse_session_datetime(stamp)


def _turn_record(sample_id: str, number: int, index: int, turn: dict[str, Any], start: datetime) -> dict[str, Any]:
    content = f"{turn['speaker']}: {turn['text']}"
    metadata: dict[str, Any] = {"session": number, "speaker": turn["speaker"], "dia_id": turn["dia_id"]}
    caption = turn.get("blip_caption")
    if caption:
        content += f" [shares an image: {caption}]"
        metadata = {"image": True, **metadata}
    return {
        "id": f"{sample_id}:{turn['dia_id']}",
        "namespace": sample_id,
        "content": content,
        "content_type": "chat",
        # i seconds after the session start keeps turn order and distinct timestamps.
        "created_at": _iso(start + timedelta(seconds=index)),
        "topics": [f"session-{number}"],
        "concepts": [],
        "supersedes": [],
        "conflicts": [],
        "supported_by": [],
        "metadata": metadata,
    }


def _evidence_ids(evidence: list[Any]) -> list[str]:
    """Split joined entries, strip, drop blanks, keep first-seen order without repeats."""
    ids: list[str] = []
    for entry in evidence:
        for part in _EVIDENCE_SPLIT.split(str(entry)):
            if part and part not in ids:
                ids.append(part)
    return ids


def _resolve(evidence_id: str, turn_ids: set[str]) -> tuple[str | None, bool]:
    """The turn id an evidence id names (or None), and whether it took a repair to find it."""
    if evidence_id in turn_ids:
        return evidence_id, False
    match = _EVIDENCE_LOOSE.match(evidence_id)
    if match:
        canonical = f"D{int(match.group(1))}:{int(match.group(2))}"
        if canonical in turn_ids:
            return canonical, True
    return None, False


def load_locomo(path: Path) -> LocomoSet:
    """Read a LoCoMo JSON file into ingest records, queries and graded qrels.

    Promises: one record per turn, id ``<sample_id>:<dia_id>``, namespace
    ``sample_id``; one query per scored question, id ``<sample_id>:q<index>``
    where index is the question's position in that conversation's ``qa`` list
    (skipped questions keep their index, so ids are stable); qrels map each
    query to its evidence memories with grade 1. Records, queries and qrels
    are in file order. Raises ``ValueError`` on duplicate turn ids or an
    unparseable session date.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    out = LocomoSet(
        skipped={"adversarial": 0, "no_evidence": 0, "unknown_evidence_only": 0, "unknown_evidence_ids": 0}
    )
    seen_ids: set[str] = set()
    for sample in data:
        sample_id = str(sample["sample_id"])
        turn_ids: set[str] = set()
        for number, turns, start in _sessions(sample["conversation"]):
            previous: str | None = None
            for index, turn in enumerate(turns):
                record = _turn_record(sample_id, number, index, turn, start)
                # The turn this one answers, for full-text search ("contextual
                # retrieval"); the first turn of a session has none.
                record["context"] = previous
                previous = record["content"]
                if record["id"] in seen_ids:
                    raise ValueError(f"duplicate turn id {record['id']!r}")
                seen_ids.add(record["id"])
                turn_ids.add(turn["dia_id"])
                out.records.append(record)
        for index, qa in enumerate(sample.get("qa", [])):
            if qa.get("category") == ADVERSARIAL_CATEGORY:
                out.skipped["adversarial"] += 1
                continue
            evidence = _evidence_ids(qa.get("evidence") or [])
            if not evidence:
                out.skipped["no_evidence"] += 1
                continue
            known: list[str] = []
            for raw in evidence:
                turn_id, repaired = _resolve(raw, turn_ids)
                if turn_id is None:
                    out.skipped["unknown_evidence_ids"] += 1
                elif turn_id not in known:
                    known.append(turn_id)
                    out.repaired_evidence_ids += repaired
            if not known:
                out.skipped["unknown_evidence_only"] += 1
                continue
            query_id = f"{sample_id}:q{index}"
            out.queries.append(
                {"id": query_id, "text": str(qa["question"]), "namespace": sample_id, "category": qa.get("category")}
            )
            out.qrels[query_id] = {f"{sample_id}:{e}": 1 for e in known}
    return out


def write_locomo_jsonl(path_in: Path, path_out: Path) -> int:
    """Write the records of ``path_in`` as JSONL (one per line) for ``dimple ingest``; return how many.

    Creates the parent directory of ``path_out``. Deterministic output.
    """
    records = load_locomo(path_in).records
    path_out = Path(path_out)
    path_out.parent.mkdir(parents=True, exist_ok=True)
    with path_out.open("w", encoding="utf-8", newline="\n") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(records)
