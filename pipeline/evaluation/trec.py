"""TREC run and qrels files: written so any TREC tool reads back the served
order, and read back for ``dimple eval compare``.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path

from pipeline.errors import EvalInputError
from pipeline.textfiles import read_lines

_TREC_UNSAFE = re.compile(r"[%\s]")


def trec_id(memory_id: str) -> str:
    """A memory id as one TREC column: whitespace and ``%`` percent-encoded
    (UTF-8), so an id with a space cannot split a line. Run and qrels files
    written here encode alike, so they still match each other."""
    return _TREC_UNSAFE.sub(lambda m: urllib.parse.quote(m.group()), memory_id)


def trec_lines(run: dict[str, list[str]], name: str) -> list[str]:
    """TREC run lines ``qid Q0 doc rank score name``; scores are rank-derived so
    any TREC tool reads back the served order exactly."""
    out = []
    for q, docs in run.items():
        out += [f"{q} Q0 {trec_id(d)} {i} {len(docs) - i + 1} {name}" for i, d in enumerate(docs, start=1)]
    return out


def qrels_lines(qrels: dict[str, dict[str, int]]) -> list[str]:
    return [f"{q} 0 {trec_id(d)} {g}" for q, docs in qrels.items() for d, g in docs.items()]


def read_trec_run(path: Path) -> dict[str, list[str]]:
    """A TREC run file back into ``{qid: [doc, ...]}`` (sorted by score, then rank)."""
    rows: dict[str, list[tuple[float, int, str]]] = {}
    for number, line in enumerate(read_lines(Path(path), str(path)), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 6:
            raise EvalInputError(f"{Path(path).name} line {number}", f"{len(parts)} columns; a TREC run line has 6")
        try:
            rows.setdefault(parts[0], []).append((-float(parts[4]), int(parts[3]), parts[2]))
        except ValueError:
            raise EvalInputError(f"{Path(path).name} line {number}", "rank and score must be numbers") from None
    return {q: [d for _, _, d in sorted(v)] for q, v in rows.items()}
