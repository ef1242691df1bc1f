"""BEIR folders (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``) as
ingest records, query specs and judgments.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pipeline.errors import EvalInputError
from pipeline.evaluation.queries import QuerySpec, json_line, read_qrels
from pipeline.textfiles import read_lines

log = logging.getLogger("dimple.eval")


def load_beir(folder: Path, split: str = "test") -> tuple[list[dict[str, Any]], list[QuerySpec], dict[str, dict[str, int]]]:
    """A BEIR folder: ``corpus.jsonl`` (``_id``, ``title``, ``text``) as ingest
    records in one namespace named after the folder, ``queries.jsonl`` and
    ``qrels/<split>.tsv``. A document with neither title nor text (cranfield
    has two) holds nothing to retrieve: it is skipped and counted in a
    warning, as BEIR's own loader and ``ir_datasets`` load such corpora
    instead of refusing them; judgments that name it stay (a query that
    wants it misses it, as any system would)."""
    folder = Path(folder)
    for need in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        if not (folder / need).is_file():
            raise EvalInputError(f"--beir {folder}", f"missing {need}")
    namespace = folder.name or "beir"
    records, empty = [], []
    corpus = folder / "corpus.jsonl"
    for number, line in enumerate(read_lines(corpus, str(corpus)), start=1):
        if not line.strip():
            continue
        row = json_line(corpus, number, line)
        if not isinstance(row, dict) or not str(row.get("_id", "")).strip():
            raise EvalInputError(f"corpus.jsonl line {number}: _id", "required")
        for name in ("title", "text"):
            if row.get(name) is not None and not isinstance(row[name], str):
                raise EvalInputError(f"corpus.jsonl line {number}: {name}", f"must be a string, not {row[name]!r}")
        content = " ".join(p for p in (str(row.get("title") or "").strip(), str(row.get("text") or "").strip()) if p)
        if not content:
            empty.append(str(row["_id"]))
            continue
        records.append({"id": str(row["_id"]), "namespace": namespace, "content": content, "content_type": "text"})
    if empty:
        shown = ", ".join(empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        log.warning("%s: skipped %d document(s) with neither title nor text: %s", corpus, len(empty), shown)
    if not records:
        raise EvalInputError(f"--beir {folder}", "corpus.jsonl holds no document with a title or text")
    queries = []
    qfile = folder / "queries.jsonl"
    for number, line in enumerate(read_lines(qfile, str(qfile)), start=1):
        if not line.strip():
            continue
        row = json_line(qfile, number, line)
        if not isinstance(row, dict) or not str(row.get("_id", "")).strip():
            raise EvalInputError(f"queries.jsonl line {number}: _id", "required")
        if not str(row.get("text") or "").strip():
            raise EvalInputError(f"queries.jsonl line {number}: text", "required")
        queries.append(QuerySpec(str(row["_id"]), str(row["text"]), {"namespace": namespace}))
    return records, queries, read_qrels(folder / "qrels" / f"{split}.tsv")
