"""The MCP server's tools: ``remember``, ``search``, ``forget``, ``get`` and
``explain``, each the ``workers.api`` function of that name with its own
argument names (``explain`` given ``why_not``: ``explain_miss``), embedded or
through the workers as the API is.

Input schemas and results are the API's own pydantic contracts
(``MemoryRecord``, ``QueryOptions``, ``Results``, ``WriteResult``): one
definition, so a field added there reaches an agent without an edit here.
The API checks the arguments and its limits; a bad one is an ``InputError``
naming the field, which the server returns as a tool error.

A server may be pinned to namespaces (``Pins``): then no tool reads or writes
a memory outside them, whatever its arguments say. ``remember`` refuses a
record of another namespace, one whose id another namespace's memory holds,
and a link to a memory outside; ``search`` runs in one of them; ``get`` and
``forget`` see only their memories (another's id reads as unknown), and
``explain`` only the audit rows of queries scoped to one of them.

A server reads its own writes (``Session``): its ``search`` and ``get`` answer
from the newest store version its ``remember`` and ``forget`` returned, or a
later one, on whichever worker process serves them (as ``min_version`` asks).
A store that answers from a version older than that no longer holds those
writes (replaced, or restored from before them): the server then reads the
store as it is (``Session.read``).

The MCP SDK is not imported here (``workers.mcp.server`` serves these tools).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.contracts import QueryOptions, Results, id_problem, options_from_recorded, text_problem, validation_error
from pipeline.errors import IngestValidationError, InputError, LineError, VersionNotReachedError
from pipeline.store.ingest import MemoryRecord
from pipeline.store.writes import WriteResult, parse_records
from workers import api, resources

T = TypeVar("T")

# Links a record makes to other memories (MemoryRecord's fields).
LINKS = ("supersedes", "conflicts", "supported_by")


@dataclass(frozen=True)
class Pins:
    """The namespaces a server is pinned to; none: every namespace."""

    namespaces: tuple[str, ...] = ()

    @classmethod
    def of(cls, namespaces: list[str] | tuple[str, ...] | None) -> Pins:
        """Pins from ``--namespace`` values, each checked as a memory's namespace is."""
        out: list[str] = []
        for ns in namespaces or ():
            if not isinstance(ns, str) or not ns.strip() or len(ns) > 256 or text_problem(ns):
                raise InputError("--namespace", f"{ns!r} is not a namespace (1-256 characters of text)")
            if ns not in out:
                out.append(ns)
        return cls(tuple(out))

    def __bool__(self) -> bool:
        return bool(self.namespaces)

    def allows(self, namespace: Any) -> bool:
        return not self.namespaces or namespace in self.namespaces

    def named(self) -> str:
        return ", ".join(repr(ns) for ns in self.namespaces)


@dataclass
class Session:
    """One server's state: its pins, and the newest store version its own
    writes returned (``written``), from which its reads answer. Without it
    a search or get that follows a ``remember`` on another worker process
    could answer from a state before the write (each process looks for new
    writes every ``store.poll_ms``)."""

    pins: Pins = field(default_factory=Pins)
    written: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def wrote(self, result: WriteResult) -> WriteResult:
        with self._lock:
            self.written = max(self.written, result.version or 0)
        return result

    def min_version(self, asked: Any = None) -> Any:
        """The ``min_version`` a read sends: the caller's when newer (or not a
        version at all: the API refuses it, naming it), else this server's last write's."""
        if asked is not None and (type(asked) is not int or asked < 0 or asked >= self.written):
            return asked
        return self.written or None

    def read(self, call: Callable[[Any], T], asked: Any = None) -> T:
        """``call(min_version)``, the version as ``min_version`` gives it. A
        store's versions never go back, so one that answers, after its wait,
        from a version older than this server's own last write no longer holds
        that write: it was replaced or restored from before it. The server then
        reads from what the store holds (the floor lowered to it) instead of
        refusing every read until the store's versions pass the old floor."""
        version = self.min_version(asked)
        try:
            return call(version)
        except VersionNotReachedError as exc:
            with self._lock:
                gone = version is not None and version == exc.wanted == self.written and (exc.seen or 0) < version
                if gone:
                    self.written = exc.seen or 0
            if not gone:
                raise
        return call(self.min_version(asked))


# -- argument contracts: the schemas an agent sees --------------------------------------
class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RememberArguments(_Arguments):
    records: MemoryRecord | list[MemoryRecord] = Field(
        description="one memory or a list of them, each the fields of an ingest line; an upsert by id "
                    "(an id is derived from namespace and content when none is given)")
    skip_invalid: bool = Field(False, description="write the valid records and list each bad one in `skipped`, "
                                                  "instead of refusing them all")


class ForgetArguments(_Arguments):
    ids: str | list[str] = Field(description="the memory ids to forget; unknown ones come back in `not_found`")
    reason: str | None = Field(None, description="why, kept with the forget")


class GetArguments(_Arguments):
    ids: str | list[str] = Field(description="memory ids; unknown and forgotten ones are left out")


class ExplainArguments(_Arguments):
    query_id: str = Field(description="a search result's `query_id`")
    why_not: str | None = Field(None, description="a memory id: why that memory was not among the query's results "
                                                  "(the stage that dropped it and the numbers behind it), instead "
                                                  "of each result's path")


class Memories(BaseModel):
    """``get``'s answer: the memories as written, in the order asked (its schema)."""

    memories: list[MemoryRecord]


def search_schema() -> dict[str, Any]:
    """``search``'s input: ``query`` and the search options (``QueryOptions``),
    less ``origin`` (who asked is the server: a caller's query)."""
    schema = QueryOptions.model_json_schema()
    props = schema["properties"]
    props.pop("origin", None)
    schema["properties"] = {"query": {"type": "string", "title": "Query", "description": "what to look for"},
                            **props}
    schema["required"] = ["query"]
    return schema


def _pinned_schema(schema: dict[str, Any], pins: Pins) -> dict[str, Any]:
    """``search``'s schema on a pinned server: ``namespace`` is one of the pins."""
    if not pins:
        return schema
    schema = {**schema, "properties": dict(schema["properties"])}
    prop = {"type": "string", "enum": list(pins.namespaces),
            "description": f"one of this server's namespaces ({pins.named()})"}
    if len(pins.namespaces) == 1:
        prop["default"] = pins.namespaces[0]
    else:
        schema["required"] = [*schema["required"], "namespace"]
    schema["properties"]["namespace"] = prop
    return schema


# -- the tools --------------------------------------------------------------------------
def _arguments(name: str, arguments: Any, model: type[BaseModel], required: tuple[str, ...]) -> dict[str, Any]:
    """The arguments as a dict of the names ``model`` lists, every required one present."""
    if not isinstance(arguments, dict):
        raise InputError("arguments", "an object of named arguments")
    for key in arguments:
        if key not in model.model_fields:
            raise InputError(str(key), f"unknown argument; {name} takes {', '.join(model.model_fields)}")
    for key in required:
        if key not in arguments:
            raise InputError(key, "required")
    return arguments


def remember(session: Session, arguments: Any) -> WriteResult:
    args = _arguments("remember", arguments, RememberArguments, ("records",))
    skip_invalid = args.get("skip_invalid", False)
    if not isinstance(skip_invalid, bool):
        raise InputError("skip_invalid", "true or false")
    records = args["records"]
    if session.pins:
        records = _pinned_records(session, records)
    return session.wrote(api.remember(records, skip_invalid=skip_invalid))


def _pinned_records(session: Session, records: Any) -> Any:
    """``records`` as ``remember`` on a pinned server may write them: a record
    without a namespace gets the one pin; a record of another namespace, one
    whose id a memory outside the pins holds, and a link to a memory outside
    are refused (``InputError`` naming the record, from 1, and the field).
    Records the API will find invalid for other reasons are left to it."""
    pins = session.pins
    if isinstance(records, list):
        items = records
    elif isinstance(records, dict):
        items = [records]
    else:
        return records  # not records at all: the API says so
    if len(pins.namespaces) == 1:
        items = [{**r, "namespace": pins.namespaces[0]} if isinstance(r, dict) and "namespace" not in r else r
                 for r in items]
    parsed = parse_records(items, resources.current().settings())
    for record, number in zip(parsed.records, parsed.lines):
        if not pins.allows(record.namespace):
            refuse(number, "namespace", f"{record.namespace!r}: this server writes only in namespaces {pins.named()}")
    own = {r.id for r in parsed.records if r.id is not None}  # parse_records gives each record its id
    stored = {m["id"]: m["namespace"] for m in session.read(lambda v: api.get(sorted(own), v))} if own else {}
    for record, number in zip(parsed.records, parsed.lines):
        if record.id in stored and not pins.allows(stored[record.id]):
            refuse(number, "id", f"{record.id!r} is held by a memory outside namespaces {pins.named()}: choose another id")
    targets = sorted({t for r in parsed.records for name in LINKS for t in getattr(r, name)} - own)
    inside = _inside(session, targets)
    for record, number in zip(parsed.records, parsed.lines):
        for name in LINKS:
            for target in getattr(record, name):
                if target not in own and target not in inside:
                    refuse(number, name, f"unknown memory id {target!r} (none in namespaces {pins.named()} "
                                         "nor in these records)")
    return items if isinstance(records, list) else items[0]


def refuse(number: int, field: str, reason: str) -> NoReturn:
    """A record a pinned server will not write, refused as the API refuses a
    bad record (``IngestValidationError``: the record, from 1, and the field);
    never skipped, whatever ``skip_invalid`` says."""
    raise IngestValidationError([LineError(number, field, reason, unit="record")])


def _inside(session: Session, ids: list[str]) -> set[str]:
    """The live memories among ``ids`` that lie in the pinned namespaces."""
    return ({m["id"] for m in session.read(lambda v: api.get(ids, v)) if session.pins.allows(m["namespace"])}
            if ids else set())


def search(session: Session, arguments: Any) -> Results:
    if not isinstance(arguments, dict):
        raise InputError("arguments", "an object of named arguments")
    if "query" not in arguments:
        raise InputError("query", "required")
    options = {k: v for k, v in arguments.items() if k != "query"}
    if "origin" in options:
        raise InputError("origin", "unknown option")
    if session.pins:
        options = _pinned_options(session.pins, options)
    if options.get("as_of") is not None:  # a past state: not the newest, which is the one that follows writes
        return api.search(arguments["query"], **options)
    return session.read(lambda version: api.search(arguments["query"], **(
        options if version is None else options | {"min_version": version})), options.get("min_version"))


def _pinned_options(pins: Pins, options: dict[str, Any]) -> dict[str, Any]:
    """The search options with ``namespace`` one of the pins (the one pin when
    none is given): the scope keeps every result and graph link inside it."""
    try:
        namespace = QueryOptions.model_validate(options).namespace  # as the API will read it
    except ValidationError as exc:
        raise validation_error(exc, "options") from exc
    if namespace is None:
        if len(pins.namespaces) > 1:
            raise InputError("namespace", f"required: this server searches one of namespaces {pins.named()}")
        return {**options, "namespace": pins.namespaces[0]}
    if not pins.allows(namespace):
        raise InputError("namespace", f"{namespace!r}: this server searches only namespaces {pins.named()}")
    return options


def forget(session: Session, arguments: Any) -> WriteResult:
    args = _arguments("forget", arguments, ForgetArguments, ("ids",))
    ids, reason = args["ids"], args.get("reason")
    if not session.pins:
        return session.wrote(api.forget(ids, reason))
    wanted = api.forget_arguments(ids, reason)
    inside = _inside(session, wanted)
    outside = [m for m in dict.fromkeys(wanted) if m not in inside]  # unknown, as far as this server tells
    if not inside:
        snap = resources.current().reader().snapshot(fresh=True)  # the store's version now, on either engine
        return WriteResult(not_found=outside, version=snap.version if snap is not None else 0)
    result = session.wrote(api.forget([m for m in wanted if m in inside], reason))
    result.not_found = [m for m in dict.fromkeys(wanted) if m in set(result.not_found) | set(outside)]
    return result


def get(session: Session, arguments: Any) -> dict[str, Any]:
    args = _arguments("get", arguments, GetArguments, ("ids",))
    found = session.read(lambda v: api.get(args["ids"], v))
    if pins := session.pins:
        found = [m for m in found if pins.allows(m["namespace"])]
        inside = _inside(session, sorted({t for m in found for name in LINKS for t in m[name]}))
        for m in found:
            for name in LINKS:
                m[name] = [t for t in m[name] if t in inside]
    return {"memories": found}  # as the API gives them (``Memories`` is their schema)


def explain(session: Session, arguments: Any) -> BaseModel | dict[str, Any]:
    """``api.explain`` (each result's path), or with ``why_not`` ``api.explain_miss``."""
    args = _arguments("explain", arguments, ExplainArguments, ("query_id",))
    query_id, why_not = args["query_id"], args.get("why_not")
    if pins := session.pins:  # only a whole query id, of a query scoped to one of the pins: any other reads as unknown
        try:
            row = api.audit_row(query_id)
        except InputError:
            row = None
        namespace = options_from_recorded(row.options).get("namespace") if row is not None else None
        if row is None or row.query_id != query_id or namespace is None or not pins.allows(namespace):
            raise InputError("query_id", f"no audit row for query {query_id!r} in namespaces {pins.named()} "
                                         "(give a search result's whole query_id)")
        if why_not is not None:  # a live memory of the pins (an outside one, or a forgotten one, reads as unknown)
            if (problem := id_problem(why_not) or text_problem(why_not)) is not None:
                raise InputError("why_not", problem)
            if why_not not in _inside(session, [why_not]):
                raise InputError("why_not", f"no memory {why_not!r} in namespaces {pins.named()}")
    if why_not is None:
        return api.explain(query_id)
    try:
        return api.explain_miss(query_id, why_not)
    except InputError as exc:  # the API's name for it
        if exc.field != "memory_id":
            raise
        raise InputError("why_not", exc.reason) from None


@dataclass(frozen=True)
class Tool:
    """One tool: its name, what it tells an agent, its contracts and the call."""

    name: str
    description: str
    input_schema: Callable[[Pins], dict[str, Any]]
    output: type[BaseModel] | None
    run: Callable[[Session, Any], BaseModel | dict[str, Any]]
    read_only: bool = True
    destructive: bool = False


def _schema(model: type[BaseModel]) -> Callable[[Pins], dict[str, Any]]:
    return lambda pins: model.model_json_schema()


TOOLS = {t.name: t for t in (
    Tool("remember", "Store memories (upsert by id): namespace, content, content_type, topics, concepts, "
                     "created_at and links (supersedes, conflicts, supported_by). Returns the ids written and the "
                     "store version; the next search sees them.",
         _schema(RememberArguments), WriteResult, remember, read_only=False),
    Tool("search", "Hybrid retrieval (full-text BM25 and vector, fused): the best memories for `query`, each "
                   "with its rank, fused score, rank in each leg and graph context (superseded_by, conflicts, "
                   "supported_by); `truncated` says whether a budget (max_units, max_chars, max_ms) cut the "
                   "list, and `query_id` names the query for `explain`.",
         lambda pins: _pinned_schema(search_schema(), pins), Results, search),
    Tool("forget", "Forget memories by id: gone from results and links at once, from every file of the store "
                   "within its erase bound (DIMPLE_STORE__ERASE_WITHIN). Unknown ids come back in `not_found`.",
         _schema(ForgetArguments), WriteResult, forget, read_only=False, destructive=True),
    Tool("get", "The memories with these ids, as written (the fields of an ingest line), in the order asked.",
         _schema(GetArguments), Memories, get),
    Tool("explain", "Why each result of a search was served (leg ranks, RRF terms, recency factor, score, the "
                    "budget's cut) from its audit row, and whether running it again now serves the same list; "
                    "with `why_not` (a memory id), why that memory was not served: the stage that dropped it "
                    "(store, scope, beam, a leg's top-k, supersession, the budget) and the "
                    "numbers behind it.",
         _schema(ExplainArguments), None, explain),
)}
