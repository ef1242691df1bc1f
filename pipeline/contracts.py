"""The typed query state that travels between stages (as JSON) and the
results a caller gets back.

A single query is a batch of one. Stages read and return ``Batch``; nothing in
here is a DuckDB row or a numpy array, so every model round-trips through JSON.
"""

from __future__ import annotations

import math
import time
import uuid
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer, field_validator, model_validator

from pipeline.errors import InputError, problems
from pipeline.identity import text_identity
from pipeline.settings import LimitSettings, Settings

LEGS = ("vector", "fts")


class Mode(str, Enum):
    """Retrieval profile: which legs run and with what weight."""

    keyword = "keyword"
    semantic = "semantic"
    hybrid = "hybrid"

    @classmethod
    def parse(cls, value: str | Mode) -> Mode:
        try:
            return cls(value)
        except ValueError:
            raise InputError("mode", cls.invalid(value)) from None

    @classmethod
    def invalid(cls, value: object) -> str:
        return f"unknown mode {value!r}; valid modes: {', '.join(m.value for m in cls)}"


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored or searched, or None when it can.

    Every text that enters dimple (query, namespace, labels, ids, content,
    context, metadata) passes here: NUL characters and lone surrogates (which
    ``json.loads`` and non-UTF-8 command-line arguments produce, and which
    cannot be encoded as UTF-8 for DuckDB) are refused.
    """
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"must be valid Unicode (lone surrogate at position {exc.start})"
    return None


# A memory id's most characters (ingest, forget, explain_miss).
MAX_ID_CHARS = 512


def id_problem(value: Any) -> str | None:
    """Why ``value`` is not a memory id (a non-blank string of at most
    ``MAX_ID_CHARS`` characters that ``text_problem`` passes), or None when it is one."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_ID_CHARS:
        return f"must be a memory id (1-{MAX_ID_CHARS} characters)"
    return text_problem(value)


def clean_text(value: str) -> str:
    """``text_problem`` as a pydantic validator: raises ``ValueError``."""
    problem = text_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def clean_labels(values: list[str]) -> list[str]:
    """Topic keys, concepts, content types, edge targets: non-blank, <= 512
    characters, no NUL, valid Unicode; returned sorted and de-duplicated."""
    for v in values:
        if not v.strip() or len(v) > 512 or text_problem(v):
            raise ValueError("entries must be non-blank strings of at most 512 characters, valid Unicode without NUL")
    return sorted(set(values))


def naive_utc(value: datetime | None) -> datetime | None:
    """Aware times converted to UTC; the store keeps naive UTC (naive input is taken as UTC)."""
    if value is not None and value.tzinfo is not None:
        try:
            value = value.astimezone(UTC).replace(tzinfo=None)
        except OverflowError:  # e.g. 0001-01-01T00:00+05:00 is before year 1 in UTC
            raise ValueError("out of the supported date range once converted to UTC") from None
    return value


class Supersession(str, Enum):
    """What a query does with a result that a newer memory supersedes
    (``pipeline.stages.augment.supersede``): ``annotate`` shows the link only,
    ``promote`` puts the newest in-scope successor directly above it,
    ``hide`` puts the successor in its place and drops it."""

    annotate = "annotate"
    promote = "promote"
    hide = "hide"


class Origin(str, Enum):
    """Who asked a query, recorded in its audit row: ``query``, a caller;
    ``eval``, ``dimple eval`` (its sets, sweeps); ``replay``, a logged query
    asked again (``dimple eval replay``, ``dimple audit explain``). Only a
    caller's queries are replayed (``recorded_origin``), so a replay through
    the workers, whose rows they log, never replays evaluation traffic."""

    query = "query"
    eval = "eval"
    replay = "replay"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Fusion(str, Enum):
    """How the legs' lists become one (``pipeline.stages.fuse``): ``rrf`` is
    the seed's weighted reciprocal rank fusion; ``convex`` adds the legs'
    min-max normalised scores, weighted by the leg weights (their share of
    the sum), a memory a leg did not return scoring 0 from it."""

    rrf = "rrf"
    convex = "convex"


class LegWeights(_Strict):
    vector: float = Field(1.0, ge=0, le=1000, allow_inf_nan=False)
    fts: float = Field(1.0, ge=0, le=1000, allow_inf_nan=False)


def parse_leg_weights(text: str, field: str = "weights") -> tuple[float, float]:
    """``"0.5:1"`` -> ``(0.5, 1.0)``: the VECTOR:FTS form of leg weights
    (``dimple search --weights``, ``dimple eval sweep --weights``), each finite,
    >= 0 and not both 0; an ``InputError`` naming ``field`` otherwise."""
    try:
        vector, fts = (float(x) for x in text.split(":"))
    except ValueError:
        raise InputError(field, f"{text!r} is not VECTOR:FTS (e.g. 0.5:1)") from None
    if not (math.isfinite(vector) and math.isfinite(fts)) or vector < 0 or fts < 0 or vector + fts == 0:
        raise InputError(field, f"{text!r}: weights are finite, >= 0 and not both 0")
    return vector, fts


class QueryOptions(_Strict):
    """What a caller may ask for besides the query text."""

    namespace: str | None = Field(None, min_length=1, max_length=256)
    topics: list[str] = Field(default_factory=list, description="topic keys (tree or user topics)")
    content_type: list[str] = Field(default_factory=list, description="one content type or several")
    concepts: list[str] = Field(default_factory=list, description="profile.conceptFilter")
    mode: Mode = Mode.hybrid
    weights: LegWeights | None = Field(None, description="override the mode's leg weights")
    recency_boost: float = Field(0.0, ge=0, le=1000, allow_inf_nan=False)
    now: datetime | None = Field(None, description="'now' for recency, so replays are deterministic")
    # Upper bounds of the budgets and top_k are settings (``limits``), checked in ``make_query``.
    max_units: int | None = Field(None, ge=1)
    max_chars: int | None = Field(None, ge=1)
    max_ms: int | None = Field(None, ge=1)
    top_k: int | None = Field(None, ge=1, description="candidates per leg")
    supersession: Supersession = Field(
        Supersession.promote, description="annotate | promote | hide: what a superseded result does (pipeline.stages.augment.supersede)"
    )
    fusion: Fusion | None = Field(None, description="rrf | convex (default: the fusion setting)")
    origin: Origin = Field(Origin.query, description="query | eval | replay: who asked (recorded in the audit row)")
    min_version: int | None = Field(
        None, ge=0, strict=True,
        description="read-your-writes: answer from a store version (lake snapshot, or manifest version) >= this, "
                    "e.g. the `version` a write returned (waits at most `store.min_version_wait_ms`)")
    as_of: int | datetime | None = Field(
        None,
        description="lake engine: answer as the store was at this snapshot (a `version` a write returned), "
                    "or at this time (ISO 8601, UTC unless it says otherwise: the last snapshot committed by "
                    "then), memories forgotten since left out; one batch reads one snapshot")

    @field_validator("as_of", mode="before")
    @classmethod
    def _snapshot_or_time(cls, value: Any) -> Any:
        # a snapshot id is an int (not a bool, float or digit string: a typo
        # must not read another snapshot); a time a datetime or ISO text
        if value is None or isinstance(value, datetime):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 1:
                raise ValueError("a snapshot id is 1 or more")
            return value
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value)
            except ValueError:
                pass
        raise ValueError("a snapshot id (an integer >= 1) or an ISO 8601 time")

    @field_validator("content_type", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        return value

    @field_validator("topics", "content_type", "concepts")
    @classmethod
    def _values(cls, values: list[str]) -> list[str]:
        return clean_labels(values)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        return None if value is None else clean_text(value)

    @field_validator("now")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return naive_utc(value)

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in Mode._value2member_map_:
            raise ValueError(Mode.invalid(value))
        return value


class Scope(_Strict):
    """Where a query may look, resolved once from its options by ``make_query``.

    The same scope is pushed into both legs before their top-k, held by
    augment and the scope stage, recorded in the audit row as is and given
    back by a replay (empty = no filter)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str | None = None
    topics: tuple[str, ...] = ()
    content_types: tuple[str, ...] = ()
    concepts: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.namespace or self.topics or self.content_types or self.concepts)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str | None) -> str | None:
        return None if value is None else clean_text(value)

    @field_validator("topics", "content_types", "concepts")
    @classmethod
    def _labels(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(clean_text(v) for v in values)

    @classmethod
    def of(cls, options: QueryOptions) -> Scope:
        return cls(
            namespace=options.namespace,
            topics=tuple(options.topics),
            content_types=tuple(options.content_type),
            concepts=tuple(options.concepts),
        )


class Budget(_Strict):
    """The query's budgets, resolved once (its options, else the settings' defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_units: int | None = Field(None, ge=1)
    max_chars: int | None = Field(None, ge=1)
    max_ms: int | None = Field(None, ge=1)


def recorded_origin(recorded: dict[str, Any]) -> Origin:
    """Who asked the query ``Query.recorded`` recorded (rows written before
    ``origin`` existed: a caller)."""
    return Origin(recorded.get("origin") or Origin.query.value)


def options_from_recorded(recorded: dict[str, Any]) -> dict[str, Any]:
    """Search options that ask again what ``Query.recorded`` recorded: the same
    scope, budget, top-k, mode, weights as asked, recency boost, ``now`` and
    supersession.

    Rows written before the scope and budget were recorded on their own carry
    the options flat (``namespace``, ``max_units``...); those are given back as they are.
    Rows written before ``supersession`` existed were served as ``annotate``
    (graph context only), and are asked again so; rows written before
    ``fusion`` existed were fused by RRF, and are asked again so.
    """
    if "scope" not in recorded:
        flat = {k: v for k, v in recorded.items() if v not in (None, [], {})}
        return {"supersession": Supersession.annotate.value, **flat}
    scope, budget = recorded["scope"], recorded["budget"]
    options = {
        "namespace": scope.get("namespace"),
        "topics": list(scope.get("topics") or []),
        "content_type": list(scope.get("content_types") or []),
        "concepts": list(scope.get("concepts") or []),
        **{k: budget.get(k) for k in ("max_units", "max_chars", "max_ms")},
        **{k: recorded.get(k) for k in ("top_k", "mode", "weights", "recency_boost", "now")},
        "supersession": recorded.get("supersession") or Supersession.annotate.value,
        # rows from before the fusion option were all fused by RRF
        "fusion": recorded.get("fusion") or Fusion.rrf.value,
    }
    return {k: v for k, v in options.items() if v not in (None, [], {})}


class Query(_Strict):
    """One query in flight: text, options as asked, what ``make_query``
    resolved (weights, top-k, scope, budget) and what earlier stages added."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    text: str
    options: QueryOptions = Field(default_factory=QueryOptions)
    started_at: float = Field(default_factory=time.time, description="wall clock, seconds")
    weights: dict[str, float] = Field(default_factory=dict)
    fusion: Fusion = Fusion.rrf
    top_k: int = Field(100, ge=1)
    scope: Scope = Field(default_factory=Scope)
    budget: Budget = Field(default_factory=Budget)
    vector: list[float] | None = None
    embedded_by: str | None = Field(None, description="the model that made ``vector`` (an embedder's name); the "
                                    "vector leg refuses a vector of another model than the store's")
    identity: str = Field("", description="FNV-1a 64 (hex) of the text, or of the vector in semantic mode")
    identity_of: Literal["text", "vector"] = "text"

    @property
    def started_utc(self) -> datetime:
        """When the query started, naive UTC: the default 'now' for recency."""
        return datetime.fromtimestamp(self.started_at, UTC).replace(tzinfo=None)

    @property
    def deadline(self) -> float | None:
        max_ms = self.budget.max_ms
        return None if max_ms is None else self.started_at + max_ms / 1000.0

    def past_deadline(self, now: float | None = None) -> bool:
        deadline = self.deadline
        return deadline is not None and (now if now is not None else time.time()) >= deadline

    @field_validator("text")
    @classmethod
    def _text(cls, value: str) -> str:
        return clean_text(value)

    @model_validator(mode="after")
    def _resolve_scope(self) -> Query:
        # the scope is the options' unless given: resolved here, once, and carried
        if "scope" not in self.model_fields_set:
            self.scope = Scope.of(self.options)
        return self

    def wants(self, leg: str) -> bool:
        return self.weights.get(leg, 0.0) > 0

    def recorded(self) -> dict[str, Any]:
        """The options as resolved, for the audit row: scope, budget, top-k,
        mode and weights as asked, recency boost, the recency ``now`` (the
        query's start when none was given), supersession and fusion, so a replay asks the same;
        and who asked (``origin``); ``as_of`` and ``min_version`` when given."""
        o = self.options
        return {
            "scope": self.scope.model_dump(mode="json"),
            "budget": self.budget.model_dump(mode="json"),
            "top_k": self.top_k,
            "mode": o.mode.value,
            "weights": o.weights.model_dump(mode="json") if o.weights is not None else None,
            "recency_boost": o.recency_boost,
            "now": (o.now or self.started_utc).isoformat(),
            "supersession": o.supersession.value,
            "fusion": self.fusion.value,
            "origin": o.origin.value,
            # the snapshot asked for (lake engine): a replay reads the row's snapshot
            **({"as_of": o.as_of} if o.as_of is not None else {}),
            **({"min_version": o.min_version} if o.min_version is not None else {}),
        }


class Hit(_Strict):
    id: str
    score: float
    rank: int


# Leg hits kept after fusion (the audit row's top scores); the rest is in ``Fused.ranks``.
TOP_HITS = 5


class LegRun(_Strict):
    """What one leg did for one query: its ranked hits and a profile for the audit.

    Fusion keeps only the first ``TOP_HITS`` hits (each candidate's leg ranks
    live on in ``Fused.ranks``) and records how many there were in ``hit_count``.
    """

    leg: Literal["vector", "fts"]
    ran: bool = False
    hits: list[Hit] = Field(default_factory=list)
    hit_count: int | None = Field(None, ge=0, description="hits the leg returned, once fusion has dropped all but the top")
    profile: dict[str, Any] = Field(default_factory=dict)

    @property
    def n_hits(self) -> int:
        """How many hits the leg returned."""
        return len(self.hits) if self.hit_count is None else self.hit_count

    def keep_top(self) -> None:
        """Drop all hits but the first ``TOP_HITS``, keeping their count (fusion has used them)."""
        self.hit_count = self.n_hits
        self.hits = self.hits[:TOP_HITS]


class Fused(_Strict):
    id: str
    rrf: float = Field(description="the fused score before recency: the RRF sum, or the convex score (fusion=convex)")
    score: float
    recency_factor: float | None = None
    ranks: dict[str, int] = Field(default_factory=dict)


class GraphLink(_Strict):
    id: str
    preview: str
    namespace: str
    content_type: str
    topics: list[str] = Field(default_factory=list)
    concepts: list[str] = Field(default_factory=list)


class Result(_Strict):
    rank: int
    id: str
    score: float
    rrf: float
    recency_factor: float | None = None
    ranks: dict[str, int] = Field(default_factory=dict)
    namespace: str
    content_type: str
    created_at: datetime
    content: str
    preview: str
    topics: list[str] = Field(default_factory=list)
    concepts: list[str] = Field(default_factory=list)
    superseded_by: list[GraphLink] = Field(default_factory=list)
    conflicts: list[GraphLink] = Field(default_factory=list)
    supported_by: list[GraphLink] = Field(default_factory=list)
    promoted_above: str | None = Field(
        None, description="supersession promote/hide: the superseded result this successor was placed directly above"
    )

    @field_validator("created_at")
    @classmethod
    def _naive_utc(cls, value: datetime) -> datetime:
        return naive_utc(value)  # type: ignore[return-value]

    @field_serializer("created_at", when_used="json")
    def _marked_utc(self, value: datetime) -> str:
        """In UTC, and said so (``+00:00``): a time given with another zone
        comes back converted, not bare."""
        return value.replace(tzinfo=UTC).isoformat()


class Truncation(_Strict):
    by: Literal["maxUnits", "maxChars", "maxMs"]
    left_out: int
    limit: int
    detail: str | None = None


class QueryState(_Strict):
    query: Query
    legs: dict[str, LegRun] = Field(default_factory=dict)
    fused: list[Fused] = Field(default_factory=list)
    results: list[Result] = Field(default_factory=list)
    truncated: bool = False
    truncation: Truncation | None = None
    timings: dict[str, float] = Field(default_factory=dict, description="ms per stage")
    scope_dropped: int = 0
    hidden_superseded: int = Field(
        0, ge=0, description="supersession=hide: superseded candidates dropped because an in-scope successor replaced them"
    )
    beyond_budget: int = Field(
        0, ge=0, description="in-scope candidates augment did not carry because max_units could not keep them"
    )
    store_version: int | None = Field(
        None, description="the store version (manifest) the results' content was read from (search.augment)"
    )

    @property
    def mode(self) -> str:
        """The mode the legs that actually ran amount to."""
        ran = {name for name, leg in self.legs.items() if leg.ran}
        if ran == {"vector", "fts"}:
            return Mode.hybrid.value
        if ran == {"fts"}:
            return Mode.keyword.value
        if ran == {"vector"}:
            return Mode.semantic.value
        return "none"


class Batch(_Strict):
    states: list[QueryState]

    def needs_embedding(self) -> bool:
        """Whether any query of the batch wants the vector leg and has no vector
        yet: a batch of keyword queries (or of given vectors) never waits on
        the embedder (``workers.canvas`` leaves ``search.embed`` out)."""
        return any(s.query.wants("vector") and s.query.vector is None for s in self.states)

    def legs(self) -> tuple[str, ...]:
        """The legs (``LEGS``, in that order) some query of the batch wants: the
        canvas runs only those (``workers.canvas``); a leg no query wants would
        record only that it did not run, which fusion records by itself. Both
        for a batch without queries."""
        return tuple(leg for leg in LEGS if any(s.query.wants(leg) for s in self.states)) or LEGS


def vectors_consumed(batch: Batch) -> Batch:
    """Drop the query vectors once the vector leg has run: nothing after it
    reads them (the semantic identity hash is taken at embedding), and each is
    ~9 KB of JSON on every later hop."""
    for state in batch.states:
        state.query.vector = None
    return batch


class Results(_Strict):
    """What a caller gets for one query."""

    query_id: str
    query: str
    mode: str
    requested_mode: Mode
    results: list[Result]
    truncated: bool
    truncation: Truncation | None = None
    legs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)
    total_ms: float = 0.0
    store_version: int | None = Field(None, description="the store version the results were read from")
    hidden_superseded: int = Field(0, description="supersession=hide: superseded memories left out for their successors")

    @classmethod
    def from_state(cls, state: QueryState) -> Results:
        return cls(
            query_id=state.query.id,
            query=state.query.text,
            mode=state.mode,
            requested_mode=state.query.options.mode,
            results=state.results,
            truncated=state.truncated,
            truncation=state.truncation,
            legs={name: {"ran": leg.ran, "hits": leg.n_hits, **leg.profile} for name, leg in state.legs.items()},
            timings=state.timings,
            total_ms=round((time.time() - state.query.started_at) * 1000.0, 3),
            store_version=state.store_version,
            hidden_superseded=state.hidden_superseded,
        )


def validation_error(exc: ValidationError, default: str) -> InputError:
    """The first problem of a pydantic error as an ``InputError`` naming the field.

    Raise it ``from exc``: a caller who wants every problem, not just the
    first, finds pydantic's ``ValidationError`` on ``__cause__``."""
    where, msg, kind = problems(exc, default)[0]
    return InputError(where, "unknown option" if kind == "extra_forbidden" else msg.removeprefix("Value error, "))


def fusion_for(options: QueryOptions, settings: Settings) -> tuple[dict[str, float], Fusion]:
    """The leg weights and fusion function a query gets: its own options
    (``weights``, ``mode``, ``fusion``) first, the settings (with the store's
    tuned values, ``Resources.settings()``) for what they leave open.
    ``make_query`` resolves them where the query is made, and ``search.fuse``
    again where it is fused, so a caller whose process sees other settings
    than the workers' (another data dir, no ``TUNED.json``) still gets the
    store's fusion."""
    if options.weights is not None:
        weights = {"vector": options.weights.vector, "fts": options.weights.fts}
    elif options.mode is Mode.keyword:
        weights = {"vector": 0.0, "fts": 1.0}
    elif options.mode is Mode.semantic:
        weights = {"vector": 1.0, "fts": 0.0}
    elif (options.fusion or settings.fusion) == Fusion.convex.value:
        weights = {"vector": settings.convex_alpha, "fts": 1.0 - settings.convex_alpha}
    else:
        weights = {"vector": settings.vector_weight, "fts": settings.fts_weight}
    return weights, options.fusion or Fusion(settings.fusion)


def make_query(text: Any, options: QueryOptions | dict[str, Any] | None, settings: Settings) -> Query:
    """Validate a caller's query and resolve weights, budgets and top-k from settings.

    Raises ``InputError`` naming the field for bad input.
    """
    if not isinstance(text, str):
        raise InputError("query", "must be a string")
    if len(text) > settings.limits.max_query_chars:
        raise InputError("query", f"{len(text)} characters, over the limit of {settings.limits.max_query_chars}")
    problem = text_problem(text)
    if problem:
        raise InputError("query", problem)
    if not text.strip():
        raise InputError("query", "must not be empty")
    if options is None:
        options = QueryOptions()
    elif not isinstance(options, QueryOptions):
        try:
            options = QueryOptions.model_validate(options)
        except ValidationError as exc:
            raise validation_error(exc, "options") from exc  # every problem stays readable on __cause__
    weights, fusion = fusion_for(options, settings)
    if not any(w > 0 for w in weights.values()):
        raise InputError("weights", "at least one leg needs a weight above 0")
    defaults = settings.budget
    query = Query(
        text=text,
        identity=text_identity(text),
        options=options,
        weights=weights,
        fusion=fusion,
        top_k=options.top_k or settings.leg_top_k,
        budget=Budget(
            max_units=options.max_units if options.max_units is not None else defaults.max_units,
            max_chars=options.max_chars if options.max_chars is not None else defaults.max_chars,
            max_ms=options.max_ms if options.max_ms is not None else defaults.max_ms,
        ),
    )
    return check_query(query, settings.limits)


def check_query(query: Query, limits: LimitSettings) -> Query:
    """The limits every query keeps (``Settings.limits``), checked where it is
    made (``make_query``) and again where a stage receives it in a message,
    so a query that did not come through the API meets the same rules and the
    same ``InputError``. Returns the query."""
    if len(query.text) > limits.max_query_chars:
        raise InputError("query", f"{len(query.text)} characters, over the limit of {limits.max_query_chars}")
    if not query.text.strip():
        raise InputError("query", "must not be empty")
    scope, budget = query.scope, query.budget
    for name, values in (("topics", scope.topics), ("content_type", scope.content_types), ("concepts", scope.concepts)):
        if len(values) > limits.max_filter_values:
            raise InputError(name, f"more than {limits.max_filter_values} values")
    for name, value, limit in (("max_units", budget.max_units, limits.max_result_units),
                               ("max_chars", budget.max_chars, limits.max_result_chars),
                               ("max_ms", budget.max_ms, limits.max_query_ms), ("top_k", query.top_k, limits.max_top_k)):
        if value is not None and value > limit:
            raise InputError(name, f"{value} is over the limit of {limit}")
    return query
