"""Ingest: validate a JSONL file of memories, embed them, write them with the
tree and the full-text index, all in one transaction.

A file with any bad line writes nothing (unless ``skip_invalid``); every bad
line is reported with its number, field and reason.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipeline import textfiles
from pipeline.contracts import MAX_ID_CHARS, clean_labels, clean_text, id_problem, naive_utc, text_problem
from pipeline.embedders import Embedder
from pipeline.errors import IngestValidationError, LineError, problems
from pipeline.settings import LimitSettings, Settings
from pipeline.store.database import Store, rows_by_ids, transaction, utcnow
from pipeline.store.fulltext import analyze, rebuild_index
from pipeline.store.vector import Tree, drop_stale_words, load_tree, save_namespaces

_ID_LIST: list[str] = Field(default_factory=list)  # a fresh empty list per record


class MemoryRecord(BaseModel):
    """One memory as a user writes it (one JSONL line)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=False)

    id: str | None = Field(None, min_length=1, max_length=MAX_ID_CHARS)
    namespace: str = Field(min_length=1, max_length=256)
    content: str = Field(min_length=1)
    content_type: str = Field("text", min_length=1, max_length=128)
    created_at: datetime | None = None
    topics: list[str] = _ID_LIST
    concepts: list[str] = _ID_LIST
    supersedes: list[str] = _ID_LIST
    conflicts: list[str] = _ID_LIST
    supported_by: list[str] = _ID_LIST
    context: str | None = Field(
        None, description="text that situates the memory (e.g. the message it answers): full-text indexed only"
    )
    metadata: dict[str, Any] | None = None

    @field_validator("namespace", "content", "content_type")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return clean_text(value)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str | None) -> str | None:
        # the rule forget, get and link targets apply (``id_problem``): a blank id
        # could be written and then never forgotten
        if value is None:
            return None
        if problem := id_problem(value):
            raise ValueError(problem)
        return clean_text(value)

    @field_validator("context")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return None if value is None else clean_text(value)

    @field_validator("topics", "concepts", "supersedes", "conflicts", "supported_by")
    @classmethod
    def _clean_list(cls, values: list[str]) -> list[str]:
        return clean_labels(values)

    @field_validator("created_at", mode="before")
    @classmethod
    def _not_a_number(cls, value: Any) -> Any:
        # pydantic would read 12345 as seconds (or, past 2e10, milliseconds) since 1970, without a word
        numeric = isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+(\.\d*)?\s*", value)
        if numeric or (isinstance(value, int | float) and not isinstance(value, bool)):
            raise ValueError("a number is ambiguous (seconds or milliseconds since 1970?): give an ISO 8601 "
                             "time such as 2025-06-02T09:00:00Z")
        return value

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return naive_utc(value)


def derive_id(namespace: str, content: str) -> str:
    """Stable id for a record without one: same namespace and content, same id."""
    return "m-" + hashlib.blake2b(f"{namespace}\x00{content}".encode(), digest_size=10).hexdigest()


def content_hash(content: str) -> str:
    return hashlib.blake2b(content.encode(), digest_size=16).hexdigest()


@dataclass
class ParsedFile:
    records: list[MemoryRecord]
    lines: list[int]
    errors: list[LineError] = field(default_factory=list)
    unit: str = "line"  # what ``lines`` number: file lines, or records given to ``remember``


def parse_lines(lines: Iterable[str], limits: LimitSettings, start: int = 1) -> ParsedFile:
    """Validate every line; collect all errors rather than stopping at the first.

    ``start`` is the file line number of the first line (for batches of a file).
    """
    records, numbers, errors = [], [], []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=start):
        if not raw.strip():
            continue
        if len(raw.encode("utf-8", "surrogatepass")) > limits.max_line_bytes:
            errors.append(LineError(number, "<line>", f"longer than {limits.max_line_bytes} bytes"))
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            errors.append(LineError(number, "<json>", f"malformed JSON: {exc.msg} at column {exc.colno}"))
            continue
        except RecursionError:
            errors.append(LineError(number, "<json>", "nested too deeply"))
            continue
        if not isinstance(data, dict):
            errors.append(LineError(number, "<json>", "a line must be a JSON object"))
            continue
        try:
            record = MemoryRecord.model_validate(data)
        except ValidationError as exc:
            errors.extend(LineError(number, where, msg) for where, msg, _ in problems(exc, "<record>"))
            continue
        line_errors = _check_limits(record, limits, number)
        if line_errors:
            errors.extend(line_errors)
            continue
        if record.id is None:
            record.id = derive_id(record.namespace, record.content)
        if record.id in seen:
            errors.append(LineError(number, "id", f"duplicate id {record.id!r} (first on line {seen[record.id]})"))
            continue
        seen[record.id] = number
        for name in ("supersedes", "conflicts", "supported_by"):
            if record.id in getattr(record, name):
                errors.append(LineError(number, name, "a memory cannot link to itself"))
        records.append(record)
        numbers.append(number)
    return ParsedFile(records, numbers, errors)


def _check_limits(record: MemoryRecord, limits: LimitSettings, number: int) -> list[LineError]:
    errors = []
    for name in ("content", "context"):
        value = getattr(record, name) or ""
        if len(value) > limits.max_content_chars:
            errors.append(
                LineError(number, name, f"{len(value)} characters, over the limit of {limits.max_content_chars}")
            )
    if record.metadata is not None:
        problem: str | None
        try:
            text = _dumps(record.metadata)
        except RecursionError:
            text, problem = "", "nested too deeply"
        else:
            problem = text_problem(text)  # keys and strings at any depth
        if problem:
            errors.append(LineError(number, "metadata", problem))
        elif (size := len(text.encode("utf-8"))) > limits.max_metadata_bytes:
            errors.append(LineError(number, "metadata", f"{size} bytes, over the limit of {limits.max_metadata_bytes}"))
    for name in ("topics", "concepts", "supersedes", "conflicts", "supported_by"):
        if len(getattr(record, name)) > limits.max_filter_values:
            errors.append(LineError(number, name, f"more than {limits.max_filter_values} entries"))
    return errors


def check_edges(parsed: ParsedFile, store: Store | None, batch_size: int | None = None,
                forgotten: frozenset[str] = frozenset()) -> None:
    """Every edge target must exist in the store or in the same file; with
    ``batch_size`` (``dimple ingest --via-broker``: each batch of so many lines
    is validated and written on its own, in order) on a line of the same
    batch or an earlier one, or in the store. ``forgotten``: ids the same
    write forgets, no target (the forget comes first)."""
    line_of = {r.id: n for r, n in zip(parsed.records, parsed.lines, strict=True)}
    links = [(number, name, target) for record, number in zip(parsed.records, parsed.lines, strict=True)
             for name in ("supersedes", "conflicts", "supported_by") for target in getattr(record, name)]

    def later(number: int, target: str) -> bool:
        return batch_size is not None and (line_of[target] - 1) // batch_size > (number - 1) // batch_size

    unsure = {t for n, _, t in links if t not in line_of or later(n, t)}
    known = (store.existing_ids(unsure) if unsure and store is not None else set()) - forgotten
    for number, name, target in links:
        if target not in known and target not in line_of:
            why = (f"memory id {target!r} is forgotten by this same write" if target in forgotten
                   else f"unknown memory id {target!r} (not in the store nor in this file)")
            parsed.errors.append(LineError(number, name, why, unit=parsed.unit))
        elif target not in known and later(number, target):
            parsed.errors.append(LineError(number, name, (
                f"memory id {target!r} is on line {line_of[target]}, in a later batch: --via-broker writes each "
                f"batch of {batch_size} lines on its own, so a memory must come no later than the batch of a line "
                "that links to it (move it up, or ingest without --via-broker)"), unit=parsed.unit))


def read_lines(path: Path) -> list[str]:
    """The lines of a JSONL file (``pipeline.textfiles``: split at ``\n`` only).
    Local validation and ``--via-broker`` batches use this one reader, so both
    see the same lines with the same numbers."""
    return textfiles.read_lines(path)


def read_file(path: Path, limits: LimitSettings) -> ParsedFile:
    return parse_lines(read_lines(path), limits)


@dataclass
class IngestReport:
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped: list[LineError] = field(default_factory=list)
    embedded: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    forgotten: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "inserted": self.inserted,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "embedded": self.embedded,
            "skipped": [str(e) for e in self.skipped],
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "namespaces": self.namespaces,
        }


def validate(parsed: ParsedFile, store: Store | None, skip_invalid: bool,
             batch_size: int | None = None, forgotten: frozenset[str] = frozenset()) -> list[LineError]:
    """Raise ``IngestValidationError`` for a bad file, or drop bad lines when skipping.

    Returns the skipped errors. Records whose edges point at skipped records
    are skipped too, until the set is closed. ``batch_size``, ``forgotten``: ``check_edges``'s.
    """
    check_edges(parsed, store, batch_size, forgotten)
    if not parsed.errors:
        return []
    if not skip_invalid:
        raise IngestValidationError(sorted(parsed.errors, key=lambda e: (e.line, e.field)))
    skipped = list(parsed.errors)
    while parsed.errors:
        bad = {e.line for e in parsed.errors}
        keep = [(r, n) for r, n in zip(parsed.records, parsed.lines) if n not in bad]
        parsed.records = [r for r, _ in keep]
        parsed.lines = [n for _, n in keep]
        parsed.errors = []
        check_edges(parsed, store, batch_size, forgotten)
        skipped.extend(parsed.errors)
    return sorted(skipped, key=lambda e: (e.line, e.field))


def embedding_text(record: MemoryRecord) -> str:
    """What the embedder sees for a memory: its content. (Embedding the context
    too made LoCoMo retrieval worse; see BENCHMARKS.md.)"""
    return record.content


def fts_text(record: MemoryRecord) -> str:
    """What BM25 indexes: content, then context (after "contextual retrieval",
    Anthropic 2024: a memory is found through the words around it too),
    ``analyze``d (accents folded, Han/kana/Hangul runs as characters and bigrams)."""
    return fts_text_of(record.content, record.context)


def fts_text_of(content: str, context: str | None) -> str:
    """``fts_text`` of a memory's stored content and context."""
    return analyze(content if not context else f"{content}\n{context}", unigrams=True)


def record_id(record: MemoryRecord) -> str:
    """A parsed record's id (given, or derived by ``parse_lines``)."""
    if record.id is None:
        raise ValueError("a record without an id: parse_lines derives one")
    return record.id


def _edges_of(record: MemoryRecord) -> list[tuple[str, str, str]]:
    """The (src, dst, kind) edges a record declares (it is their ``origin``)."""
    rid = record_id(record)
    return sorted([(rid, t, "supersedes") for t in record.supersedes] + [(rid, t, "conflicts") for t in record.conflicts]
                  + [(t, rid, "supports") for t in record.supported_by])


def unchanged_ids(con, records: list[MemoryRecord]) -> set[str]:
    """Ids of the records ``con``'s store already holds exactly as given: the
    same namespace, content, content type, context, metadata, user topics,
    concepts and declared edges, and the same ``created_at`` when the record
    gives one. Writing such a record would change nothing."""
    ids = [record_id(r) for r in records]
    if not ids:
        return set()
    stored = {
        row[0]: row[1:]
        for row in rows_by_ids(
            con, "SELECT id, namespace, content_hash, content_type, created_at, metadata::VARCHAR, context "
            "FROM memories WHERE {id}", ids, lookups=True)
    }
    if not stored:
        return set()
    known = list(stored)
    topics: dict[str, list[str]] = {}
    for mid, topic in rows_by_ids(
            con, "SELECT memory_id, topic_key FROM memory_topics WHERE kind = 'user' AND {memory_id}", known, lookups=True):
        topics.setdefault(mid, []).append(topic)
    concepts: dict[str, list[str]] = {}
    for mid, concept in rows_by_ids(con, "SELECT memory_id, concept FROM memory_concepts WHERE {memory_id}", known, lookups=True):
        concepts.setdefault(mid, []).append(concept)
    edges: dict[str, list[tuple[str, str, str]]] = {}
    for src, dst, kind, origin in rows_by_ids(con, "SELECT src, dst, kind, origin FROM edges WHERE {origin}", known, lookups=True):
        edges.setdefault(origin, []).append((src, dst, kind))
    same = set()
    for r in records:
        rid = record_id(r)
        if rid not in stored:
            continue
        namespace, digest, ctype, created, metadata, context = stored[rid]
        if (
            (namespace, digest, ctype, context) == (r.namespace, content_hash(r.content), r.content_type, r.context)
            and (r.created_at is None or r.created_at == created)
            and (None if metadata is None else _json(json.loads(metadata))) == _json(r.metadata)
            and sorted(topics.get(rid, [])) == r.topics
            and sorted(concepts.get(rid, [])) == r.concepts
            and sorted(edges.get(rid, [])) == _edges_of(r)
        ):
            same.add(rid)
    return same


def ingest_records(
    store: Store,
    records: list[MemoryRecord],
    embedder: Embedder,
    settings: Settings,
    *,
    progress: bool = False,
    now: datetime | None = None,
    vectors_of: dict[str, np.ndarray] | None = None,
    forget: list[str] | None = None,
) -> IngestReport:
    """Write validated records: embed what changed, upsert, maintain tree and index.

    One transaction: on any failure nothing is written. Records the store
    already holds as given (``unchanged_ids``) are counted, not written; when
    every record is, nothing is written and the generation stays.
    ``vectors_of`` gives embeddings already computed (a compaction: ``embedder``
    is then not used); ``forget`` ids are deleted, with their tree places,
    annotations and declared edges, in the same transaction.
    """
    report = IngestReport()
    t0 = time.perf_counter()
    con = store.con
    same = unchanged_ids(con, records)
    report.unchanged = len(same)
    records = [r for r in records if r.id not in same]
    ids = [record_id(r) for r in records]
    rows = con.execute(
        "SELECT id, content_hash, namespace FROM memories WHERE id IN (SELECT unnest(?))", [ids]
    ).fetchall() if ids else []
    existing = {mid: digest for mid, digest, _ in rows}
    old_ns = {mid: ns for mid, _, ns in rows}
    hashes = [content_hash(r.content) for r in records]
    to_embed = [i for i, r in enumerate(records) if existing.get(r.id) != hashes[i] or old_ns.get(r.id) != r.namespace]
    report.seconds["prepare"] = time.perf_counter() - t0

    t1 = time.perf_counter()
    dim = store.info.embedding_dim
    vectors = np.zeros((len(records), dim), dtype=np.float32)
    if to_embed and vectors_of is not None:
        vectors[to_embed] = np.stack([vectors_of[ids[i]] for i in to_embed])
    elif to_embed:
        texts = [embedding_text(records[i]) for i in to_embed]
        vectors[to_embed] = _embed_batched(embedder, texts, settings.embed_batch_size, progress)
    report.embedded = len(to_embed)
    report.seconds["embed"] = time.perf_counter() - t1

    t2 = time.perf_counter()
    now = now or utcnow()
    changed = set(to_embed)
    with transaction(con):
        tree = load_tree(con, settings.tree)
        touched_ns: set[str] = set()
        if forget:
            report.forgotten = _forget_rows(con, tree, forget, touched_ns)
        new_rows = [i for i, r in enumerate(records) if r.id not in existing]
        moved_rows = [i for i in to_embed if records[i].id in existing]
        for i in moved_rows:
            tree.remove(ids[i])
            touched_ns.add(old_ns[ids[i]])
        _upsert_memories(con, records, hashes, vectors, changed, existing, now)
        _replace_annotations(con, records)
        report.seconds["upsert"] = time.perf_counter() - t2
        report.inserted = len(new_rows)
        report.updated = len(records) - len(new_rows)
        placed = [i for i in new_rows] + moved_rows
        _place_in_tree(con, tree, records, vectors, placed, touched_ns)
        save_namespaces(con, tree, touched_ns)
        report.seconds["tree"] = time.perf_counter() - t2 - report.seconds["upsert"]
        t3 = time.perf_counter()
        if records or report.forgotten:
            rebuild_index(con, settings.fulltext)
            store.set_meta("fts_generation", str(store.generation + 1))
            store.set_meta("generation", str(store.generation + 1))
        report.seconds["fulltext"] = time.perf_counter() - t3
    report.namespaces = sorted(touched_ns)
    report.seconds["write"] = time.perf_counter() - t2
    report.seconds["total"] = time.perf_counter() - t0
    return report


def _embed_batched(embedder: Embedder, texts: list[str], batch: int, progress: bool) -> np.ndarray:
    chunk = max(batch * 8, 256)
    if not progress or len(texts) <= chunk:
        return embedder.embed(texts)
    from tqdm import tqdm  # only with a progress bar (a CLI's bulk embedding)

    out = []
    with tqdm(total=len(texts), desc="embedding", unit="mem", file=sys.stderr) as bar:
        for start in range(0, len(texts), chunk):
            part = texts[start : start + chunk]
            out.append(embedder.embed(part))
            bar.update(len(part))
    return np.concatenate(out)


def _upsert_memories(con, records, hashes, vectors, changed, existing, now) -> None:
    rows = [i for i, r in enumerate(records) if r.id not in existing or i in changed]
    meta_only = [i for i, r in enumerate(records) if r.id in existing and i not in changed]
    if rows:
        con.execute("DELETE FROM memories WHERE id IN (SELECT unnest(?))", [[records[i].id for i in rows]])
        with embedding_rows(con, vectors[rows]) as emb_sql:
            con.execute(
                "INSERT INTO memories (id, namespace, content, content_type, created_at, content_hash, embedding, "
                "metadata, ingested_at, context, fts_text) "
                "SELECT m.id, m.ns, m.content, m.ctype, m.created, m.hash, e.embedding, "
                "m.meta::JSON, m.ingested, m.context, m.fts FROM (SELECT unnest(?) AS pos, unnest(?) AS id, "
                "unnest(?) AS ns, unnest(?) AS content, unnest(?) AS ctype, unnest(?) AS created, unnest(?) AS hash, "
                "unnest(?) AS meta, unnest(?) AS ingested, unnest(?) AS context, unnest(?) AS fts) m "
                "JOIN (" + emb_sql + ") e USING (pos)",
                [
                    list(range(len(rows))),
                    [records[i].id for i in rows],
                    [records[i].namespace for i in rows],
                    [records[i].content for i in rows],
                    [records[i].content_type for i in rows],
                    [records[i].created_at or now for i in rows],
                    [hashes[i] for i in rows],
                    [_json(records[i].metadata) for i in rows],
                    [now] * len(rows),
                    [records[i].context for i in rows],
                    [fts_text(records[i]) for i in rows],
                ],
            )
    for i in meta_only:
        r = records[i]
        con.execute(
            "UPDATE memories SET content_type = ?, created_at = ?, metadata = ?::JSON, ingested_at = ?, "
            "context = ?, fts_text = ? WHERE id = ?",
            [r.content_type, r.created_at or now, _json(r.metadata), now, r.context, fts_text(r), r.id],
        )


@contextmanager
def embedding_rows(con, matrix: np.ndarray) -> Iterator[str]:
    """SQL selecting ``(pos, embedding)`` rows from the numpy matrix, registered
    on ``con`` as a view for the ``with`` block.

    Binding vectors as nested-list parameters is slow (every float parsed as a
    parameter); DuckDB scans registered numpy columns directly. The
    SQL holds only column names.
    """
    n, dim = matrix.shape
    columns = np.ascontiguousarray(matrix.T, dtype=np.float64)  # one contiguous column per dimension
    con.register(_VECTORS_VIEW, {"pos": np.arange(n, dtype=np.int64), **{f"e{j}": columns[j] for j in range(dim)}})
    cols = ", ".join(f"e{j}" for j in range(dim))
    try:
        yield f"SELECT pos, [{cols}]::FLOAT[{dim}] AS embedding FROM {_VECTORS_VIEW}"
    finally:
        con.unregister(_VECTORS_VIEW)


_VECTORS_VIEW = "dimple_ingest_vectors"


def _dumps(value: Any) -> str:
    """Metadata as stored: the same text the size limit is checked on."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _json(value: Any) -> str | None:
    return None if value is None else _dumps(value)


def _replace_annotations(con, records: list[MemoryRecord]) -> None:
    """User topics, concepts and the edges each record declares, replaced wholesale."""
    ids = [r.id for r in records]
    con.execute("DELETE FROM memory_topics WHERE kind = 'user' AND memory_id IN (SELECT unnest(?))", [ids])
    con.execute("DELETE FROM memory_concepts WHERE memory_id IN (SELECT unnest(?))", [ids])
    con.execute("DELETE FROM edges WHERE origin IN (SELECT unnest(?))", [ids])
    topic_rows = [(r.id, t) for r in records for t in r.topics]
    concept_rows = [(r.id, c) for r in records for c in r.concepts]
    edge_rows = (
        [(r.id, t, "supersedes", r.id) for r in records for t in r.supersedes]
        + [(r.id, t, "conflicts", r.id) for r in records for t in r.conflicts]
        + [(t, r.id, "supports", r.id) for r in records for t in r.supported_by]
    )
    if topic_rows:
        con.execute(
            "INSERT INTO memory_topics SELECT unnest(?), unnest(?), 'user'",
            [[a for a, _ in topic_rows], [b for _, b in topic_rows]],
        )
    if concept_rows:
        con.execute(
            "INSERT INTO memory_concepts SELECT unnest(?), unnest(?)",
            [[a for a, _ in concept_rows], [b for _, b in concept_rows]],
        )
    if edge_rows:
        cols = list(zip(*edge_rows))
        con.execute(
            "INSERT INTO edges SELECT unnest(?), unnest(?), unnest(?), unnest(?)", [list(c) for c in cols]
        )


def _forget_rows(con, tree: Tree, ids: list[str], touched: set[str]) -> int:
    """Delete memories ``ids``: their rows, tree places (centroids moved off
    them), annotations, the edges they declared and every edge to or from
    them (a link to a forgotten memory is dropped, SECURITY.md). Returns how
    many were held."""
    rows = con.execute(
        "SELECT id, namespace, embedding FROM memories WHERE id IN (SELECT unnest(?))", [ids]).fetchall()
    for mid, namespace, embedding in rows:
        tree.remove(mid, np.asarray(embedding, dtype=np.float32))
        touched.add(namespace)
    held = [r[0] for r in rows]
    if held:
        for sql in (
            "DELETE FROM memories WHERE id IN (SELECT unnest(?))",
            "DELETE FROM memory_topics WHERE memory_id IN (SELECT unnest(?))",
            "DELETE FROM memory_concepts WHERE memory_id IN (SELECT unnest(?))",
            "DELETE FROM edges WHERE origin IN (SELECT unnest(?))",
        ):
            con.execute(sql, [held])
    con.execute("DELETE FROM edges WHERE src IN (SELECT unnest(?)) OR dst IN (SELECT unnest(?))", [ids, ids])
    return len(held)


def _place_in_tree(con, tree: Tree, records, vectors, rows: list[int], touched: set[str]) -> None:
    """New namespaces are clustered whole; others take memories one by one."""
    by_ns: dict[str, list[int]] = {}
    for i in rows:
        by_ns.setdefault(records[i].namespace, []).append(i)
    pending = {records[i].id: (vectors[i], records[i].content) for i in rows}

    def fetch(member_ids: list[str]):
        known = [m for m in member_ids if m not in pending]
        stored = {}
        if known:
            for mid, emb, content in con.execute(
                "SELECT id, embedding, content FROM memories WHERE id IN (SELECT unnest(?))", [known]
            ).fetchall():
                stored[mid] = (np.asarray(emb, dtype=np.float32), content)
        got = [pending[m] if m in pending else stored[m] for m in member_ids]
        return np.stack([g[0] for g in got]), [g[1] for g in got]

    for ns in sorted(by_ns):
        touched.add(ns)
        idx = sorted(by_ns[ns], key=lambda i: records[i].id)
        if not tree.namespace_keys(ns):
            # Whole namespace is new: cluster it (the stored rows of this ns, if any, are all in idx).
            tree.build_namespace(
                ns, [records[i].id for i in idx], vectors[idx], [records[i].content for i in idx]
            )
        else:
            for i in idx:
                tree.insert(ns, records[i].id, vectors[i], records[i].content, fetch)


def rebuild_tree(store: Store, settings: Settings) -> Tree:
    """``dimple reindex``: cluster every namespace from scratch, re-derive the
    text the full-text index covers and rebuild the index."""
    con = store.con
    with transaction(con):
        tree = Tree(settings.tree)
        namespaces = store.namespaces()
        for ns in namespaces:
            rows = con.execute(
                "SELECT id, embedding, content FROM memories WHERE namespace = ? ORDER BY id", [ns]
            ).fetchall()
            tree.build_namespace(
                ns, [r[0] for r in rows], np.asarray([r[1] for r in rows], dtype=np.float32), [r[2] for r in rows]
            )
        con.execute("DELETE FROM topics")
        con.execute("DELETE FROM memory_topics WHERE kind IN ('leaf', 'ancestor')")
        save_namespaces(con, tree, namespaces)
        reanalyze(con)
        rebuild_index(con, settings.fulltext)
        store.set_meta("fts_generation", str(store.generation + 1))
        store.set_meta("generation", str(store.generation + 1))
    return tree


def reanalyze(con) -> None:
    """Re-derive ``fts_text`` of every memory whose text is not ASCII (``analyze``
    leaves ASCII alone): a store written before the analyzer
    changed indexes what this version would write."""
    rows = con.execute("SELECT id, content, context FROM memories "
                       r"WHERE regexp_matches(content || coalesce(context, ''), '[^\x00-\x7F]')").fetchall()
    if not rows:
        return
    con.execute("CREATE OR REPLACE TEMP TABLE reanalyzed (id VARCHAR, fts_text VARCHAR)")
    con.execute("INSERT INTO reanalyzed SELECT unnest(?), unnest(?)",
                [[r[0] for r in rows], [fts_text_of(r[1], r[2]) for r in rows]])
    con.execute("UPDATE memories SET fts_text = r.fts_text FROM reanalyzed r "
                "WHERE memories.id = r.id AND memories.fts_text IS DISTINCT FROM r.fts_text")
    con.execute("DROP TABLE reanalyzed")


def relabel_topics(store: Store, settings: Settings, namespaces: list[str]) -> None:
    """Rename the topics of ``namespaces`` whose keys hold a word that none of
    their memories holds any more (``tree.drop_stale_words``): after a forget,
    no topic key keeps a word of the forgotten text."""
    con = store.con
    with transaction(con):
        tree = load_tree(con, settings.tree)
        texts = dict(con.execute("SELECT id, content FROM memories WHERE namespace IN (SELECT unnest(?))",
                                 [namespaces]).fetchall())
        save_namespaces(con, tree, drop_stale_words(tree, namespaces, texts.__getitem__))
