"""The demo's sentence tables and structure specs, read once from ``pipeline/datasets/demo_data/*.json``.

Each data file is a JSON object: an ``about`` note (a list of lines) and named
tables. Every table becomes the constant named after it in upper case (a
leading underscore where only this module uses it), and loading fails if a file
holds a table nothing reads, or a row with a field nobody expects.

The data never holds code. Where a spec needs logic (how a supersession chain
draws its values, the slots a flight chain adds) it names an entry of the
registries below, ``VALUE_KINDS`` and ``EXTRAS``. A pool written as a string is
the name of a list in ``names.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from importlib.resources import files
from typing import Any

from pipeline.datasets.demo.world import World, wday

FILES = ("names", "chains", "conflicts", "incidents", "supports", "code", "messages", "queries")

Values = Callable[[World, list[datetime], dict[str, str]], list[str]]
Extra = Callable[[World], dict[str, str]]
Tagged = tuple[str, tuple[str, ...], tuple[str, ...]]  # (sentence, topics, concepts)


def read(name: str) -> dict[str, Any]:
    """One data file, parsed (``about`` included)."""
    text = (files("pipeline.datasets") / "demo_data" / f"{name}.json").read_text(encoding="utf-8")
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("about"), list):
        raise ValueError(f"{name}.json: expected an object with an 'about' list of lines")
    return data


class _File:
    """A data file's tables: ``take`` hands each out once, ``close`` fails on any nobody took."""

    def __init__(self, name: str, data: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self._tables = dict(read(name) if data is None else data)
        self._tables.pop("about", None)

    def take(self, table: str) -> Any:
        if table not in self._tables:
            raise ValueError(f"{self.name}.json: no table {table!r}")
        return self._tables.pop(table)

    def close(self) -> None:
        if self._tables:
            raise ValueError(f"{self.name}.json: tables nothing reads: {sorted(self._tables)}")


def _frozen(value: Any) -> Any:
    """JSON lists as tuples, all the way down (the specs are immutable)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def _strings(table: Any, where: str) -> tuple[str, ...]:
    if not isinstance(table, list) or not all(isinstance(s, str) for s in table):
        raise ValueError(f"{where}: expected a list of strings")
    return tuple(table)


def _fields(obj: Mapping[str, Any], where: str, required: Sequence[str], optional: Sequence[str] = ()) -> None:
    missing = [f for f in required if f not in obj]
    unknown = sorted(set(obj) - set(required) - set(optional))
    if missing or unknown:
        raise ValueError(f"{where}: missing fields {missing}, unknown fields {unknown}")


def _rows(table: list[Mapping[str, Any]], where: str, *fields: str, **optional: Any) -> tuple[tuple[Any, ...], ...]:
    """Row objects as tuples in ``fields`` order, then the ``optional`` ones (with their defaults)."""
    out = []
    for i, row in enumerate(table):
        _fields(row, f"{where}[{i}]", fields, tuple(optional))
        out.append(tuple(_frozen(row[f]) for f in fields) + tuple(_frozen(row.get(f, d)) for f, d in optional.items()))
    return tuple(out)


def _tagged(table: list[Mapping[str, Any]], where: str) -> tuple[Tagged, ...]:
    return _rows(table, where, "text", "topics", "concepts")


# --------------------------------------------------------------------------- #
# names: a string pool elsewhere is the name of one of these lists
# --------------------------------------------------------------------------- #

_names = _File("names")
ENGINEERS = _strings(_names.take("engineers"), "names.engineers")
FRIENDS = _strings(_names.take("friends"), "names.friends")
_names.close()
_NAMED_POOLS = {"engineers": ENGINEERS, "friends": FRIENDS}


def _pool(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        if value not in _NAMED_POOLS:
            raise ValueError(f"{where}: no list {value!r} in names.json")
        return _NAMED_POOLS[value]
    return _strings(value, where)


# --------------------------------------------------------------------------- #
# registries: the logic a spec names
# --------------------------------------------------------------------------- #


def _hosts(role: str, internal: bool = False) -> Values:
    return lambda w, ts, ex: [w.host(role, internal) for _ in ts]


def _ascending(pool: Sequence[str]) -> Values:
    # Consecutive pool entries: a chain of "raised from X to Y" reads true.
    def values(w: World, ts: list[datetime], ex: dict[str, str]) -> list[str]:
        i = w.rng.randint(0, len(pool) - len(ts))
        return list(pool[i : i + len(ts)])

    return values


def _shuffled(pool: Sequence[str]) -> Values:
    return lambda w, ts, ex: w.rng.sample(list(pool), len(ts))


def _prefix_of_one(sequences: Sequence[Sequence[str]]) -> Values:
    # One whole sequence, so consecutive values follow a plausible path (vegetarian, then vegan).
    return lambda w, ts, ex: list(w.rng.choice(sequences)[: len(ts)])


def _dated(make: Callable[[World, datetime], str]) -> Values:
    def values(w: World, ts: list[datetime], ex: dict[str, str]) -> list[str]:
        out: list[str] = []
        for t in ts:
            v = make(w, t)
            while v in out:  # "moved from X to X" would read as nonsense
                v = make(w, t + timedelta(days=len(out) + 1))
            out.append(v)
        return out

    return values


def _appointment(w: World, t: datetime) -> str:
    day = t + timedelta(days=w.rng.randint(6, 25))
    return f"{wday(day)} at {w.rng.choice(_APPOINTMENT_TIMES)}"


def _flight_values(w: World, ts: list[datetime], ex: dict[str, str]) -> list[str]:
    trip = ts[-1] + timedelta(days=w.rng.randint(20, 40))
    out = []
    for i, _ in enumerate(ts):
        day = trip + timedelta(days=i * w.rng.choice((1, 2, 3)))
        out.append(f"{w.flight(ex['airline'])} on {wday(day)}")
    return out


def _trip(w: World) -> dict[str, str]:
    city, country, airline = w.rng.choice(_TRIPS)
    return {"dest": city, "country": country, "airline": airline, "seat": w.rng.choice(_SEATS)}


# A chain's "values": {"kind": name, ...arguments}.
VALUE_KINDS: dict[str, Callable[..., Values]] = {
    "hosts": _hosts,
    "ascending": _ascending,
    "shuffled": _shuffled,
    "prefix_of_one": _prefix_of_one,
    "appointments": lambda: _dated(_appointment),
    "flights": lambda: _flight_values,
}
# A chain's "extra": slots it adds to every template (and its question).
EXTRAS: dict[str, Extra] = {"trip": _trip}


def _values(spec: Mapping[str, Any], where: str) -> Values:
    args = dict(spec)
    kind = args.pop("kind", None)
    if kind not in VALUE_KINDS:
        raise ValueError(f"{where}: unknown value kind {kind!r} (known: {sorted(VALUE_KINDS)})")
    if "pool" in args:
        args["pool"] = _pool(args["pool"], f"{where}.pool")
    if "sequences" in args:
        args["sequences"] = tuple(_strings(s, f"{where}.sequences") for s in args["sequences"])
    return VALUE_KINDS[kind](**args)


def _draw(slots: Mapping[str, Any], where: str) -> Extra:
    """A conflict's "extra": each slot drawn from its pool."""
    pools = {slot: _pool(pool, f"{where}.{slot}") for slot, pool in slots.items()}
    return lambda w: {slot: w.rng.choice(pool) for slot, pool in pools.items()}


# --------------------------------------------------------------------------- #
# supersession chains
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class ChainSpec:
    namespace: str
    topics: tuple[str, ...]
    concepts: tuple[str, ...]
    types: tuple[str, str]  # content type of the first memory, of the updates
    source: str
    first: tuple[str, ...]  # templates with {v}
    update: tuple[str, ...]  # templates with {old} and {v}
    values: Values
    question: str  # a paraphrase of "what is the current value?"
    ident_kind: str = ""  # non-empty: the values are identifiers of this kind
    extra: Extra | None = None


def _chain(obj: Mapping[str, Any], where: str) -> ChainSpec:
    _fields(obj, where, ("namespace", "topics", "concepts", "types", "source", "first", "update", "values",
                         "question"), ("ident_kind", "extra"))
    plain = {k: _frozen(v) for k, v in obj.items() if k not in ("values", "extra")}
    extra = obj.get("extra")
    if extra is not None and extra not in EXTRAS:
        raise ValueError(f"{where}: unknown extra {extra!r} (known: {sorted(EXTRAS)})")
    return ChainSpec(**plain, values=_values(obj["values"], f"{where}.values"),
                     extra=EXTRAS[extra] if extra is not None else None)


_chains = _File("chains")
_TRIPS = _rows(_chains.take("trips"), "chains.trips", "city", "country", "airline")
_SEATS = _strings(_chains.take("seats"), "chains.seats")
_APPOINTMENT_TIMES = _strings(_chains.take("appointment_times"), "chains.appointment_times")
CHAINS = tuple(_chain(obj, f"chains.chains[{i}]") for i, obj in enumerate(_chains.take("chains")))
_chains.close()


# --------------------------------------------------------------------------- #
# conflicting pairs
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class ConflictSpec:
    namespace: str
    topics: tuple[str, ...]
    concepts: tuple[str, ...]
    types: tuple[str, str]
    sources: tuple[str, str]
    a: tuple[str, ...]
    b: tuple[str, ...]
    pool: tuple[str, ...]
    question: str
    grades: tuple[int, int] = (1, 1)  # (2, 1): the first statement is the authoritative one
    extra: Extra | None = None


def _conflict(obj: Mapping[str, Any], where: str) -> ConflictSpec:
    _fields(obj, where, ("namespace", "topics", "concepts", "types", "sources", "a", "b", "pool", "question"),
            ("grades", "extra"))
    plain = {k: _frozen(v) for k, v in obj.items() if k != "extra"}
    extra = _draw(obj["extra"], f"{where}.extra") if "extra" in obj else None
    return ConflictSpec(**plain, extra=extra)


_conflicts = _File("conflicts")
CONFLICTS = tuple(_conflict(obj, f"conflicts.conflicts[{i}]") for i, obj in enumerate(_conflicts.take("conflicts")))
_conflicts.close()


# --------------------------------------------------------------------------- #
# incidents: log lines supporting a conclusion
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class IncidentSpec:
    code: str  # the exact error identifier
    service: str
    topics: tuple[str, ...]
    concepts: tuple[str, ...]
    host_role: tuple[str, bool]
    aux_role: tuple[str, bool]
    path: str
    logs: tuple[str, ...]  # one or two are used, in order
    conclusion: str
    question: str  # the symptom in other words
    major: int = 2


def _incident(obj: Mapping[str, Any], where: str) -> IncidentSpec:
    _fields(obj, where, ("code", "service", "topics", "concepts", "host_role", "aux_role", "path", "logs",
                         "conclusion", "question"), ("major",))
    return IncidentSpec(**{k: _frozen(v) for k, v in obj.items()})


_incidents = _File("incidents")
INCIDENTS = tuple(_incident(obj, f"incidents.incidents[{i}]") for i, obj in enumerate(_incidents.take("incidents")))
FOLLOWUPS = _strings(_incidents.take("followups"), "incidents.followups")
_incidents.close()


# --------------------------------------------------------------------------- #
# supports: evidence backing a conclusion
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class SupportSpec:
    evidence: str
    evidence_type: str
    conclusion: str
    conclusion_type: str
    topics: tuple[str, ...]
    concepts: tuple[str, ...]
    question: str
    # The event's date range when the calendar matters (a summer camp is in summer).
    window: tuple[datetime, datetime] | None = None


def _support(obj: Mapping[str, Any], where: str) -> SupportSpec:
    _fields(obj, where, ("evidence", "evidence_type", "conclusion", "conclusion_type", "topics", "concepts",
                         "question"), ("window",))
    plain = {k: _frozen(v) for k, v in obj.items() if k != "window"}
    if "window" not in obj:
        return SupportSpec(**plain)
    lo, hi = (datetime.fromisoformat(t) for t in obj["window"])
    if lo.tzinfo is None or hi.tzinfo is None or not lo < hi:
        raise ValueError(f"{where}.window: expected two increasing UTC instants")
    return SupportSpec(**plain, window=(lo, hi))


_supports = _File("supports")
SUPPORTS = tuple(_support(obj, f"supports.supports[{i}]") for i, obj in enumerate(_supports.take("supports")))
HOTELS = _rows(_supports.take("hotels"), "supports.hotels", "name", "city")
RESTAURANTS = _strings(_supports.take("restaurants"), "supports.restaurants")
_supports.close()


# --------------------------------------------------------------------------- #
# code namespace: the everyday memories
# --------------------------------------------------------------------------- #

_code = _File("code")
SERVICES = _rows(_code.take("services"), "code.services", "name", "major")
DEPLOY_ENVS = _strings(_code.take("deploy_envs"), "code.deploy_envs")
DEPLOY_EXTRAS = _rows(_code.take("deploy_extras"), "code.deploy_extras", "text", "concepts")
DEPLOY_TEMPLATES = _strings(_code.take("deploy_templates"), "code.deploy_templates")
REVIEWS = _rows(_code.take("reviews"), "code.reviews", "path", "comment", "topics", "concepts")
REVIEW_TEMPLATES = _strings(_code.take("review_templates"), "code.review_templates")
SNIPPETS = _rows(_code.take("snippets"), "code.snippets", "path", "snippet", "topics", "concepts")
SNIPPET_TEMPLATES = _strings(_code.take("snippet_templates"), "code.snippet_templates")
# (command, topics, concepts, host) where host is (role, internal) or None
COMMANDS = _rows(_code.take("commands"), "code.commands", "cmd", "topics", "concepts", host=None)
COMMAND_TEMPLATES = _strings(_code.take("command_templates"), "code.command_templates")
DECISIONS = _tagged(_code.take("decisions"), "code.decisions")
DECISION_TEMPLATES = _strings(_code.take("decision_templates"), "code.decision_templates")
CONFIG_FACTS = _tagged(_code.take("config_facts"), "code.config_facts")
CONFIG_TEMPLATES = _strings(_code.take("config_templates"), "code.config_templates")
DEV_NOTES = _tagged(_code.take("dev_notes"), "code.dev_notes")
_code.close()


# --------------------------------------------------------------------------- #
# messages namespace
# --------------------------------------------------------------------------- #

_messages = _File("messages")
PEOPLE = _tagged(_messages.take("people"), "messages.people")
PEOPLE_TEMPLATES = _strings(_messages.take("people_templates"), "messages.people_templates")
PREFERENCES = _tagged(_messages.take("preferences"), "messages.preferences")
PREFERENCE_TEMPLATES = _strings(_messages.take("preference_templates"), "messages.preference_templates")
PLANS = _tagged(_messages.take("plans"), "messages.plans")
TRAVEL = _tagged(_messages.take("travel"), "messages.travel")
MEETING_PEOPLE = _strings(_messages.take("meeting_people"), "messages.meeting_people")
MEETING_SUBJECTS = _rows(_messages.take("meeting_subjects"), "messages.meeting_subjects", "subject", "concepts")
MEETING_PLACES = _strings(_messages.take("meeting_places"), "messages.meeting_places")
MEETING_TIMES = _strings(_messages.take("meeting_times"), "messages.meeting_times")
MEETING_TEMPLATES = _strings(_messages.take("meeting_templates"), "messages.meeting_templates")
CHATS = _tagged(_messages.take("chats"), "messages.chats")
HOUSEHOLD = _tagged(_messages.take("household"), "messages.household")
_messages.close()


# --------------------------------------------------------------------------- #
# query wording
# --------------------------------------------------------------------------- #

_queries = _File("queries")
IDENTIFIER_QUESTIONS: dict[str, tuple[str, ...]] = {
    kind: _strings(questions, f"queries.identifier_questions.{kind}")
    for kind, questions in _queries.take("identifier_questions").items()
}
# (question, namespace or None, required (field, value) pairs)
TOPICAL: tuple[tuple[str, str | None, tuple[tuple[str, str], ...]], ...] = tuple(
    (text, namespace, tuple(required.items()))
    for text, namespace, required in _rows(_queries.take("topical"), "queries.topical", "text", "namespace", "required")
)
_queries.close()
