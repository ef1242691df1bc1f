"""Evaluation inputs: query sets (JSONL) and judgments (TREC or BEIR TSV), read
and validated line by line, and reconciled with each other.

A run is ``{query_id: [doc_id, ...]}`` best first; qrels are
``{query_id: {doc_id: grade}}`` with grade > 0 relevant.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.contracts import QueryOptions, make_query
from pipeline.errors import EvalInputError, InputError
from pipeline.settings import Settings
from pipeline.textfiles import read_lines

# Top-level fields of a query line besides the search options.
_QUERY_FIELDS = {"id", "_id", "query", "text", "options", "metadata"}

OPTION_FIELDS = frozenset(QueryOptions.model_fields)  # a query line's search options: the API's own

# -- inputs ------------------------------------------------------------------------------
@dataclass
class QuerySpec:
    """One query to run: its id, text and search options."""

    id: str
    text: str
    options: dict[str, Any] = field(default_factory=dict)

    def ask(self, defaults: dict[str, Any]) -> dict[str, Any]:
        return {"query": self.text, **defaults, **self.options}


@dataclass
class QuerySet:
    """Queries with judgments, and what was left out on the way (by reason)."""

    name: str
    queries: list[QuerySpec]
    qrels: dict[str, dict[str, int]]
    skipped: dict[str, list[str]] = field(default_factory=dict)
    loader_skipped: dict[str, int] = field(default_factory=dict)  # counted by a loader, without ids


def json_line(path: Path, number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise EvalInputError(f"{path.name} line {number}", f"not valid JSON ({exc.msg} at column {exc.colno})") from None


def read_queries(path: Path, settings: Settings) -> list[QuerySpec]:
    """JSONL queries: ``{"id", "query" (or "text"), options...}`` per line.

    Options sit at the top level or under ``"options"`` (namespace, topics,
    content_type, concepts, mode, weights, recency_boost, now, max_units,
    max_chars, max_ms, top_k, supersession) and are validated as a search would validate
    them. Raises ``EvalInputError`` naming the line and field of the first
    problem; blank lines are ignored.
    """
    path = Path(path)
    if not path.is_file():
        raise EvalInputError(str(path), "no such file")
    out: list[QuerySpec] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(read_lines(path, str(path)), start=1):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        row = json_line(path, number, line)
        if not isinstance(row, dict):
            raise EvalInputError(where, "each line must be a JSON object")
        unknown = sorted(set(row) - _QUERY_FIELDS - OPTION_FIELDS)
        if unknown:
            raise EvalInputError(f"{where}: {unknown[0]}", "unknown field")
        qid = row.get("id", row.get("_id"))
        if not isinstance(qid, (str, int)) or isinstance(qid, bool) or not str(qid).strip():
            raise EvalInputError(f"{where}: id", "required (a non-empty string)")
        qid = str(qid)
        if any(c.isspace() for c in qid):
            raise EvalInputError(f"{where}: id", f"{qid!r} contains whitespace (TREC files split on it)")
        if qid in seen:
            raise EvalInputError(f"{where}: id", f"duplicate of line {seen[qid]}")
        seen[qid] = number
        text = row.get("query", row.get("text"))
        if not isinstance(row.get("options") or {}, dict):
            raise EvalInputError(f"{where}: options", "must be a JSON object")
        options = dict(row.get("options") or {})
        options.update({k: v for k, v in row.items() if k in OPTION_FIELDS})
        try:
            query = make_query(text if text is not None else "", options, settings)
        except InputError as exc:
            name = "query" if exc.field == "query" and text is None else exc.field
            reason = "required" if text is None else exc.reason
            raise EvalInputError(f"{where}: {name}", reason) from None
        out.append(QuerySpec(qid, query.text, options))  # the validated text: a non-empty str
    return out


def read_qrels(path: Path) -> dict[str, dict[str, int]]:
    """TREC (``qid iter doc grade``) or BEIR TSV (``query-id corpus-id score``,
    header optional) relevance judgments. Raises ``EvalInputError`` naming the
    line and column of the first problem."""
    path = Path(path)
    if not path.is_file():
        raise EvalInputError(str(path), "no such file")
    qrels: dict[str, dict[str, int]] = {}
    for number, line in enumerate(read_lines(path, str(path)), start=1):
        parts = line.split()
        if not parts:
            continue
        where = f"{path.name} line {number}"
        if number == 1 and parts[0].lower() in ("query-id", "query_id", "qid"):
            continue  # BEIR header
        if len(parts) == 3:
            qid, doc, grade = parts
        elif len(parts) == 4:
            qid, _, doc, grade = parts
        else:
            raise EvalInputError(where, f"{len(parts)} columns; expected 4 (TREC: qid iter doc grade) or 3 (BEIR: qid doc grade)")
        try:  # "1.0" is a whole grade as some tools write it; "2.7", "nan" and "inf" are not grades
            number_read = float(grade)
            if not number_read.is_integer():
                raise ValueError
            value = int(number_read)
        except ValueError:
            raise EvalInputError(f"{where}: relevance", f"{grade!r} is not an integer grade") from None
        qrels.setdefault(qid, {})[doc] = value
    return qrels


def reconcile(name: str, queries: list[QuerySpec], qrels: dict[str, dict[str, int]], strict: bool = False) -> QuerySet:
    """Keep the queries that have a relevant judgment; say what was left out.

    Skipped, by reason: ``qrels_for_unknown_queries`` (judgments naming no
    query of the set), ``queries_without_judgments`` and
    ``queries_without_relevant`` (judged, but every grade is 0). With
    ``strict`` the first two are errors. An empty result is always an error.
    """
    ids = {q.id for q in queries}
    unknown = sorted(q for q in qrels if q not in ids)
    unjudged = [q.id for q in queries if q.id not in qrels]
    no_relevant = [q.id for q in queries if q.id in qrels and not any(g > 0 for g in qrels[q.id].values())]
    if strict and unknown:
        raise EvalInputError("qrels", f"{len(unknown)} judged query id(s) not in the query set, first {unknown[0]!r}")
    if strict and unjudged:
        raise EvalInputError("queries", f"{len(unjudged)} query(ies) without judgments, first {unjudged[0]!r}")
    left_out = set(no_relevant)
    kept = [q for q in queries if q.id in qrels and q.id not in left_out]
    if not queries:
        raise EvalInputError("queries", "the query set is empty")
    if not kept:
        why = ""
        if unknown:  # most often the two files spell the ids differently
            why = (f" ({len(unknown)} judged query id(s) are not in the query set, e.g. {unknown[0]!r}; "
                   f"the set's ids are e.g. {sorted(ids)[0]!r})")
        raise EvalInputError("qrels", f"no query of the set has a relevant judgment: nothing to evaluate{why}")
    skipped = {
        "qrels_for_unknown_queries": unknown,
        "queries_without_judgments": unjudged,
        "queries_without_relevant": no_relevant,
    }
    return QuerySet(name, kept, {q.id: qrels[q.id] for q in kept}, {k: v for k, v in skipped.items() if v})
