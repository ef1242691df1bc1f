"""The audit row: one ``retrieval_log`` record per query, built from the
finished query state, and the synchronous ``hybrid.search`` log line.

Everything that explains a result (leg ranks, RRF terms, recency, budget cut,
the options as they were resolved) is in the row, so "why did the agent say
this?" is answered from the row alone (``pipeline.audit.explain``).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import duckdb
from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipeline.contracts import TOP_HITS, QueryState, naive_utc, text_problem


class AuditRecord(BaseModel):
    """One ``retrieval_log`` row, as it travels to ``audit.write`` (JSON)."""

    # a row from elsewhere on the audit queue with a NaN would pass here and fail its NOT NULL
    # column at every retry, with the rows batched beside it
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    query_id: str = Field(pattern=r"^[^/\\]+$", max_length=512)  # names a dead letter's file: no path in it
    logged_at: datetime
    query_hash: str
    hash_of: str
    mode: str
    requested_mode: str
    query_text: str | None
    options: dict[str, Any]
    query_profile: dict[str, Any]
    sources: list[dict[str, Any]]
    result_count: int
    truncated: bool
    truncation: dict[str, Any] | None = None
    latency_ms: dict[str, float] = Field(default_factory=dict)
    total_ms: float
    rrf_k: int

    @field_validator("*")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        # A row built by search.budget always is storable; one that arrives
        # from elsewhere on the audit queue may hold text DuckDB cannot store.
        for where, text in _strings(value):
            problem = text_problem(text)
            if problem:
                raise ValueError(f"{where}: {problem}" if where else problem)
        return value

    @field_validator("query_id")
    @classmethod
    def _a_name(cls, value: str) -> str:
        if value in (".", ".."):
            raise ValueError("must not be '.' or '..'")
        return value

    @field_validator("logged_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        return naive_utc(value)  # type: ignore[return-value]  # the column is naive UTC: DuckDB drops an offset


def _strings(value: Any, where: str = "") -> list[tuple[str, str]]:
    """Every string in a JSON value (keys included), with its path."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            out += _strings(key, f"{where}.{key}".lstrip(".")) + _strings(item, f"{where}.{key}".lstrip("."))
        return out
    if isinstance(value, list):
        return [s for i, item in enumerate(value) for s in _strings(item, f"{where}.{i}")]
    return []


# The settings that shape what a query retrieves besides its own options (those
# are in ``options``), recorded in ``query_profile["settings"]`` so a replay
# (``pipeline.audit.whynot``) runs the stages as they ran: top level, then per section.
RETRIEVAL_SETTINGS = ("vector_weight", "fts_weight", "convex_alpha")
RETRIEVAL_SECTIONS = {"tree": ("beam_width", "max_depth"), "fulltext": ("k1", "b")}


def retrieval_settings(settings: Any) -> dict[str, Any]:
    """``settings``' values of ``RETRIEVAL_SETTINGS`` and ``RETRIEVAL_SECTIONS``
    (those it has), as JSON values."""
    fields = type(settings).model_fields
    out: dict[str, Any] = {name: getattr(settings, name) for name in RETRIEVAL_SETTINGS if name in fields}
    for section, names in RETRIEVAL_SECTIONS.items():
        if section in fields:
            part = getattr(settings, section)
            out[section] = {n: getattr(part, n) for n in names if n in type(part).model_fields}
    return out


def build_record(state: QueryState, rrf_k: int, store_text: bool, now: float | None = None,
                 settings: dict[str, Any] | None = None) -> AuditRecord:
    """The audit row for a finished query state; ``settings``: the
    ``retrieval_settings`` the query ran with, kept in ``query_profile``.

    Built without validation (``model_construct``): every string in it was
    checked where it entered (the query at the API, ``check_query`` again
    in each stage; ids and topics at ingest), and ``_storable`` walking
    them all again took ~0.3 ms of every query (``ops.bench.latency``,
    2026-12-05). ``audit.write`` validates each row that arrives on its
    queue (``workers.audit.valid_records``)."""
    q = state.query
    legs = {}
    for name, leg in sorted(state.legs.items()):
        legs[name] = {
            "ran": leg.ran,
            "weight": q.weights.get(name, 0.0),
            "hits": leg.n_hits,
            "top_scores": [round(h.score, 6) for h in leg.hits[:TOP_HITS]],
            "profile": leg.profile,
        }
    sources = [
        {
            "id": r.id,
            "rank": r.rank,
            "ranks": r.ranks,
            "rrf": r.rrf,
            "recency_factor": r.recency_factor,
            "score": r.score,
            "chars": len(r.content),
            **({"promoted_above": r.promoted_above} if r.promoted_above else {}),
        }
        for r in state.results
    ]
    end = now if now is not None else time.time()
    return AuditRecord.model_construct(
        query_id=q.id,
        logged_at=q.started_utc,
        query_hash=q.identity,
        hash_of=q.identity_of,
        mode=state.mode,
        requested_mode=q.options.mode.value,
        query_text=q.text if store_text else None,
        options=q.recorded(),
        query_profile={"legs": legs, "weights": q.weights, "scope_dropped": state.scope_dropped,
                       "store_version": state.store_version, "hidden_superseded": state.hidden_superseded,
                       **({"settings": settings} if settings is not None else {})},
        sources=sources,
        result_count=len(state.results),
        truncated=state.truncated,
        truncation=state.truncation.model_dump(mode="json") if state.truncation else None,
        latency_ms=dict(state.timings),
        total_ms=round((end - q.started_at) * 1000.0, 3),
        rrf_k=rrf_k,
    )


def log_line(record: AuditRecord) -> str:
    """The synchronous ``hybrid.search`` line: key=value, one per query."""
    legs = record.query_profile.get("legs", {})
    counts = ",".join(f"{name}:{leg['hits']}" for name, leg in legs.items() if leg.get("ran"))
    return (
        f"hybrid.search query_id={record.query_id} hash={record.query_hash} mode={record.mode} "
        f"legs={counts or '-'} results={record.result_count} truncated={str(record.truncated).lower()} "
        f"latency_ms={record.total_ms:.1f}"
    )


# -- the audit store ------------------------------------------------------------
COLUMNS = list(AuditRecord.model_fields)

JSON_COLUMNS = {"options", "query_profile", "sources", "truncation", "latency_ms"}

# DuckDB types of the retrieval_log columns (schema/lake), for the casts in ``insert_rows``
TYPES = {
    "query_id": "VARCHAR", "logged_at": "TIMESTAMP", "query_hash": "VARCHAR", "hash_of": "VARCHAR", "mode": "VARCHAR",
    "requested_mode": "VARCHAR", "query_text": "VARCHAR", "options": "JSON", "query_profile": "JSON",
    "sources": "JSON", "result_count": "INTEGER", "truncated": "BOOLEAN", "truncation": "JSON",
    "latency_ms": "JSON", "total_ms": "DOUBLE", "rrf_k": "INTEGER",
}

# ``insert_rows``: each row as its JSON text (pydantic-core writes it), read into
# the columns by DuckDB (``from_json``). Python touches a row once; building
# the columns in Python (``model_dump``, ``json.dumps`` per JSON column, a
# registered view of object arrays that DuckDB scans holding the GIL) took
# ~80 ms of GIL time per 1,000 rows, which the embedded writer thread took from
# the queries of its process (ops.bench.audit). ``logged_at`` is read as text and
# cast as a bound time is: DuckDB's cast keeps a time's clock digits and drops
# any offset.
_SHAPE = json.dumps({c: "JSON" if c in JSON_COLUMNS else "VARCHAR" if c == "logged_at" else TYPES[c]
                     for c in COLUMNS})
INSERT_ROWS = (f"INSERT INTO retrieval_log ({', '.join(COLUMNS)}) "
               f"SELECT {', '.join(f'r.{c}::{TYPES[c]}' for c in COLUMNS)} "
               f"FROM (SELECT from_json(j::JSON, '{_SHAPE}') AS r FROM (SELECT unnest(?::VARCHAR[]) AS j))")


def insert_rows(con: duckdb.DuckDBPyConnection, records: list[AuditRecord]) -> None:
    """INSERT ``records`` into ``retrieval_log`` over ``con`` (in the caller's
    transaction). A JSON null becomes SQL NULL (``query_text``, ``truncation``)."""
    con.execute(INSERT_ROWS, [[r.model_dump_json() for r in records]])
