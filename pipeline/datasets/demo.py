"""A deterministic demo corpus of agent memories, with a judged query set.

Two namespaces: ``code`` holds an engineering agent's memories (deploy notes,
incidents and their log lines, code review notes, config facts, commands,
decisions); ``messages`` holds a personal assistant's memories of chats
(preferences, people, plans, travel, meetings).

The generator plants the structure the engine is meant to exploit and knows
where it put it, so relevance judgments come from that knowledge, not from
searching the texts:

* supersession chains (a fact, then its replacement, sometimes a third value),
* conflicting pairs (two sources that disagree and neither replaces the other),
* supports (log lines backing an incident's conclusion, a booking confirmation
  backing a plan),
* exact identifiers (error codes, hosts, paths, tickets, versions, booking
  references) that each occur in a handful of memories only.

Everything is drawn from one ``random.Random(seed)``; the same seed gives the
same bytes. Nothing reads the clock.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = ["generate_corpus", "generate_queries", "write_demo"]

_UTC = UTC
_START = datetime(2025, 1, 1, 7, 0, tzinfo=_UTC)
_END = datetime(2025, 9, 30, 21, 0, tzinfo=_UTC)

_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

# Slot names whose values are exact identifiers; every memory records the ones
# it contains so identifier queries can be judged without searching.
_IDENT_SLOTS = frozenset(
    {"code", "host", "node", "aux", "ticket", "version", "path", "path2", "booking", "flight", "bucket"}
)


# --------------------------------------------------------------------------- #
# small pure helpers
# --------------------------------------------------------------------------- #


def _iso(dt: datetime) -> str:
    """ISO-8601 UTC with a ``Z`` suffix, second precision."""
    return f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}Z"


def _day(dt: datetime) -> str:
    """'12 June' (locale independent, unlike strftime %B)."""
    return f"{dt.day} {_MONTHS[dt.month - 1]}"


def _wday(dt: datetime) -> str:
    """'Thursday 12 June'."""
    return f"{_WEEKDAYS[dt.weekday()]} {dt.day} {_MONTHS[dt.month - 1]}"


def _workday(dt: datetime, days: int) -> datetime:
    """``days`` after ``dt``, pushed past a weekend onto the next Monday."""
    out = dt + timedelta(days=days)
    return out + timedelta(days=(7 - out.weekday()) % 7) if out.weekday() >= 5 else out


def _slot_names(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def _fill(
    template: str, slots: Mapping[str, str], ident_slots: Iterable[str] = _IDENT_SLOTS
) -> tuple[str, list[str]]:
    """Format ``template``; also return the identifier values it actually used."""
    wanted = set(ident_slots)
    idents: list[str] = []
    for name in _slot_names(template):
        if name in wanted and slots[name] not in idents:
            idents.append(slots[name])
    return template.format(**slots), idents


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# --------------------------------------------------------------------------- #
# the generator's state while it builds one corpus
# --------------------------------------------------------------------------- #


@dataclass
class _Draft:
    key: int
    namespace: str
    content: str
    content_type: str
    when: datetime
    topics: list[str]
    concepts: list[str]
    idents: list[str]
    supersedes: list[int]
    conflicts: list[int]
    supported_by: list[int]
    metadata: dict[str, Any]
    # 2 when this memory is a best answer for its subject (newest of a chain,
    # an incident's conclusion, a decision); 1 otherwise.
    grade: int


@dataclass
class _Ident:
    value: str
    namespace: str
    kind: str
    primary: int  # draft key judged 2; the other drafts containing it get 1


@dataclass
class _QuerySpec:
    text: str
    namespace: str | None
    kind: str
    judged: dict[int, int]


@dataclass
class _World:
    rng: random.Random
    drafts: list[_Draft] = field(default_factory=list)
    idents: list[_Ident] = field(default_factory=list)
    paraphrases: list[_QuerySpec] = field(default_factory=list)  # always asked
    optional_paraphrases: list[_QuerySpec] = field(default_factory=list)  # sampled
    topical: list[_QuerySpec] = field(default_factory=list)
    taken: set[str] = field(default_factory=set)

    # -- identifiers (each unique in the corpus) ---------------------------- #

    def _unique(self, make: Callable[[], str]) -> str:
        for _ in range(10_000):
            value = make()
            if value not in self.taken:
                self.taken.add(value)
                return value
        raise RuntimeError("identifier space exhausted")  # pools are far larger than used

    def host(self, role: str, internal: bool = False) -> str:
        # Uniqueness is on the bare name so "web-3" and "web-3.internal" never both exist.
        name = self._unique(lambda: f"{role}-{self.rng.randint(2, 99)}")
        return f"{name}.internal" if internal else name

    def ticket(self, prefix: str = "JIRA") -> str:
        return self._unique(lambda: f"{prefix}-{self.rng.randint(1000, 9999)}")

    def version(self, major: int) -> str:
        return self._unique(lambda: f"v{major}.{self.rng.randint(0, 24)}.{self.rng.randint(0, 9)}")

    def booking(self) -> str:
        alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ"
        digits = "23456789"

        def make() -> str:
            chars = [self.rng.choice(alphabet) for _ in range(4)] + [self.rng.choice(digits) for _ in range(2)]
            self.rng.shuffle(chars)
            return "".join(chars)

        return self._unique(make)

    def flight(self, airline: str) -> str:
        return self._unique(lambda: f"{airline}{self.rng.randint(120, 2999)}")

    def pr(self) -> str:
        return self._unique(lambda: f"#{self.rng.randint(400, 2999)}")

    def pick(self, pool: Sequence[str]) -> str:
        """A pool entry nobody else has used yet."""
        free = [p for p in pool if p not in self.taken]
        value = self.rng.choice(free)
        self.taken.add(value)
        return value

    # -- time --------------------------------------------------------------- #

    def at(self, lo: datetime = _START, hi: datetime = _END) -> datetime:
        """A random instant in [lo, hi], in waking hours (07:00-21:00) so chat memories read plausibly."""
        first = datetime(lo.year, lo.month, lo.day, tzinfo=_UTC)
        days = (hi - first).days
        for _ in range(100):
            t = first + timedelta(days=self.rng.randint(0, days), minutes=self.rng.randrange(7 * 60, 21 * 60))
            if lo <= t <= hi:
                return t
        return lo

    def times(self, k: int, gap_days: int) -> list[datetime]:
        """k strictly increasing instants in the corpus period, on days at least ``gap_days`` apart."""
        first = datetime(_START.year, _START.month, _START.day, tzinfo=_UTC)
        free = (_END - first).days - gap_days * (k - 1)
        picks = sorted(self.rng.randrange(free) for _ in range(k))
        return [
            first + timedelta(days=p + gap_days * i, minutes=self.rng.randrange(7 * 60, 21 * 60))
            for i, p in enumerate(picks)
        ]

    # -- memories ----------------------------------------------------------- #

    def add(
        self,
        namespace: str,
        content: str,
        content_type: str,
        when: datetime,
        topics: Sequence[str],
        concepts: Sequence[str] = (),
        idents: Sequence[str] = (),
        source: str = "",
        supersedes: Sequence[int] = (),
        conflicts: Sequence[int] = (),
        supported_by: Sequence[int] = (),
        grade: int = 1,
        extra_meta: Mapping[str, Any] | None = None,
    ) -> int:
        if not 1 <= len(topics) <= 2 or len(concepts) > 3:
            raise AssertionError(f"tag counts out of range for {content!r}")
        for ident in idents:
            if ident not in content:
                raise AssertionError(f"identifier {ident!r} not in {content!r}")
        key = len(self.drafts)
        metadata: dict[str, Any] = {"source": source} if source else {}
        if extra_meta:
            metadata.update(extra_meta)
        self.drafts.append(
            _Draft(
                key=key,
                namespace=namespace,
                content=content,
                content_type=content_type,
                when=when,
                topics=list(dict.fromkeys(topics)),
                concepts=list(dict.fromkeys(concepts)),
                idents=list(dict.fromkeys(idents)),
                supersedes=list(supersedes),
                conflicts=list(conflicts),
                supported_by=list(supported_by),
                metadata=metadata,
                grade=grade,
            )
        )
        return key

    def ident(self, value: str, namespace: str, kind: str, primary: int) -> None:
        self.idents.append(_Ident(value, namespace, kind, primary))


# --------------------------------------------------------------------------- #
# supersession chains
# --------------------------------------------------------------------------- #

_Values = Callable[[_World, list[datetime], dict[str, str]], list[str]]


@dataclass(frozen=True)
class _ChainSpec:
    namespace: str
    topics: tuple[str, ...]
    concepts: tuple[str, ...]
    types: tuple[str, str]  # content type of the first memory, of the updates
    source: str
    first: tuple[str, ...]  # templates with {v}
    update: tuple[str, ...]  # templates with {old} and {v}
    values: _Values
    question: str  # a paraphrase of "what is the current value?"
    ident_kind: str = ""  # non-empty: the values are identifiers of this kind
    extra: Callable[[_World], dict[str, str]] | None = None


def _hosts(role: str, internal: bool = False) -> _Values:
    return lambda w, ts, ex: [w.host(role, internal) for _ in ts]


def _ascending(pool: Sequence[str]) -> _Values:
    # Consecutive pool entries: a chain of "raised from X to Y" reads true.
    def values(w: _World, ts: list[datetime], ex: dict[str, str]) -> list[str]:
        i = w.rng.randint(0, len(pool) - len(ts))
        return list(pool[i : i + len(ts)])

    return values


def _shuffled(pool: Sequence[str]) -> _Values:
    return lambda w, ts, ex: w.rng.sample(list(pool), len(ts))


def _dated(make: Callable[[_World, datetime], str]) -> _Values:
    def values(w: _World, ts: list[datetime], ex: dict[str, str]) -> list[str]:
        out: list[str] = []
        for t in ts:
            v = make(w, t)
            while v in out:  # "moved from X to X" would read as nonsense
                v = make(w, t + timedelta(days=len(out) + 1))
            out.append(v)
        return out

    return values


def _appointment(w: _World, t: datetime) -> str:
    day = t + timedelta(days=w.rng.randint(6, 25))
    return f"{_wday(day)} at {w.rng.choice(('08:45', '09:30', '11:15', '14:00', '16:40'))}"


def _flight_values(w: _World, ts: list[datetime], ex: dict[str, str]) -> list[str]:
    trip = ts[-1] + timedelta(days=w.rng.randint(20, 40))
    out = []
    for i, _ in enumerate(ts):
        day = trip + timedelta(days=i * w.rng.choice((1, 2, 3)))
        out.append(f"{w.flight(ex['airline'])} on {_wday(day)}")
    return out


def _trip(w: _World) -> dict[str, str]:
    city, country, airline = w.rng.choice(
        (("Lisbon", "Portugal", "TP"), ("Porto", "Portugal", "TP"), ("Barcelona", "Spain", "VY"),
         ("Copenhagen", "Denmark", "SK"), ("Vienna", "Austria", "OS"), ("Athens", "Greece", "A3"))
    )
    return {"dest": city, "country": country, "airline": airline, "seat": w.rng.choice(("14C", "22A", "7F", "31D"))}


_ENGINEERS = ("Dana", "Marco", "Yuki", "Femi", "Lena", "Arjun", "Sofia", "Tariq")

_CHAINS: tuple[_ChainSpec, ...] = (
    # ---- code ------------------------------------------------------------ #
    _ChainSpec(
        "code", ("database",), ("postgres", "staging"), ("text", "text"), "slack",
        ("Staging Postgres lives on {v}. Use the read-only role for ad-hoc queries; writes go through migrations only.",
         "FYI the staging database host is {v} (port 5432, sslmode=require)."),
        ("Staging DB host moved from {old} to {v} after the disk migration; update your ~/.pgpass.",
         "Heads up: staging Postgres is now on {v}. {old} gets decommissioned at the end of the week."),
        _hosts("db"), "where does the pre-production database live now?", ident_kind="host",
    ),
    _ChainSpec(
        "code", ("infra", "auth"), ("redis",), ("text", "text"), "slack",
        ("Session cache is Redis on {v}:6379 with no persistence, so it is safe to flush in an emergency.",
         "Login sessions are kept in Redis at {v}:6379."),
        ("Session Redis moved from {old} to {v}; the old box was retired after the kernel upgrade.",
         "Update the session store address: {v} replaces {old}."),
        _hosts("cache", internal=True), "which machine holds the login session store?", ident_kind="host",
    ),
    _ChainSpec(
        "code", ("api",), ("rate-limiting",), ("decision", "decision"), "adr",
        ("Public API rate limit is {v} per token, with bursts up to twice that for 10 seconds.",
         "We settled on {v} per API token as the default rate limit."),
        ("Changed the public API rate limit from {old} to {v} per token after reviewing partner traffic.",
         "New default API rate limit: {v} per token (was {old})."),
        _shuffled(("300 requests/minute", "600 requests/minute", "900 requests/minute",
                   "1,200 requests/minute", "2,000 requests/minute")),
        "before a customer starts getting HTTP 429s, how much traffic can they send?",
    ),
    _ChainSpec(
        "code", ("database", "performance"), ("postgres", "pgbouncer"), ("text", "text"), "slack",
        ("pgbouncer default_pool_size for the api cluster is {v}.",
         "The api's pgbouncer runs with default_pool_size = {v}; raise it only together with max_connections."),
        ("Bumped pgbouncer default_pool_size from {old} to {v} after the connection saturation alerts.",
         "pgbouncer pool for the api is now {v} server connections per database (up from {old})."),
        _ascending(("20", "30", "40", "60", "80", "120")),
        "how many server connections does the connection pooler keep open per database?",
    ),
    _ChainSpec(
        "code", ("ci",), ("python",), ("decision", "decision"), "adr",
        ("All backend services target Python {v}; CI images are built from python:{v}-slim.",
         "Backend runtime is Python {v}. Don't use newer syntax until we upgrade."),
        ("Upgraded the backend runtime from Python {old} to {v}; requires-python in pyproject follows.",
         "We are on Python {v} now (was {old}); the CI matrix dropped the old version."),
        _ascending(("3.9", "3.10", "3.11", "3.12", "3.13")),
        "which interpreter release do our services run on?",
    ),
    _ChainSpec(
        "code", ("infra",), ("kafka",), ("text", "text"), "slack",
        ("Kafka bootstrap server for prod is {v}:9092.",
         "Producers in prod bootstrap against {v}:9092."),
        ("Kafka bootstrap moved from {old} to {v}; clients pick it up from the config map on restart.",
         "New Kafka bootstrap address {v} (the {old} broker was replaced)."),
        _hosts("kafka", internal=True),
        "what address do event consumers use to find the message broker cluster?", ident_kind="host",
    ),
    _ChainSpec(
        "code", ("observability",), ("retention", "budget"), ("text", "decision"), "slack",
        ("Loki keeps application logs for {v} days; anything older is only in cold storage.",),
        ("Log retention in Loki changed from {old} to {v} days after the cost review.",
         "Decision from the cost review: keep logs {v} days instead of {old}."),
        _ascending(("7", "14", "30", "45", "90")),
        "how far back can I look at service output before it is purged?",
    ),
    _ChainSpec(
        "code", ("auth",), ("jwt",), ("text", "decision"), "slack",
        ("Access tokens (JWT) expire after {v} minutes; refresh tokens last 14 days.",
         "JWT access token lifetime is {v} minutes."),
        ("Access token lifetime changed from {old} to {v} minutes per the security review.",
         "Security review outcome: JWT access tokens now live {v} minutes (previously {old})."),
        _shuffled(("15", "30", "60", "120")),
        "how long until a signed-in user's credential needs renewing?",
    ),
    _ChainSpec(
        "code", ("incidents", "auth"), ("on-call",), ("text", "text"), "slack",
        ("Primary escalation for auth incidents is {v}; page via the #auth-oncall channel.",
         "If login breaks, {v} is the escalation point for the auth service."),
        ("{v} took over auth incident escalation from {old}.",
         "Escalation for auth incidents is now {v}, not {old}."),
        _shuffled(_ENGINEERS), "who should I wake up when sign-in is broken at night?",
    ),
    _ChainSpec(
        "code", ("infra", "performance"), ("kubernetes",), ("text", "text"), "slack",
        ("HPA for the image-worker deployment scales to at most {v} replicas.",),
        ("Raised the image-worker HPA maxReplicas from {old} to {v} ahead of the spring campaign.",
         "image-worker can now scale to {v} pods (maxReplicas was {old})."),
        _ascending(("6", "10", "16", "24", "32")),
        "what is the ceiling on background job pods when autoscaling?",
    ),
    _ChainSpec(
        "code", ("database",), ("backups", "s3"), ("text", "text"), "wiki",
        ("Nightly pg_dump backups are written to {v} with a 30-day lifecycle rule.",),
        ("Backups now go to {v} instead of {old}; the old bucket is read-only.",
         "Moved the nightly dump target from {old} to {v} (encryption at rest with the new KMS key)."),
        _shuffled(("s3://acme-pg-backups", "s3://acme-db-snapshots", "s3://acme-backup-vault-2025",
                   "s3://acme-pgdump-eu-west-1")),
        "where do the nightly database dumps end up?", ident_kind="bucket",
    ),
    _ChainSpec(
        "code", ("deploy",), ("release",), ("decision", "decision"), "adr",
        ("Release branches are cut from main every {v} at 10:00 UTC.",),
        ("Release cut day moved from {old} to {v} so QA gets a full day before the weekend.",
         "From now on we cut release branches on {v} (was {old})."),
        _shuffled(("Monday", "Tuesday", "Wednesday", "Thursday")),
        "on which weekday do we branch off for a new version?",
    ),
    # ---- messages -------------------------------------------------------- #
    _ChainSpec(
        "messages", ("food",), ("coffee",), ("note", "chat"), "notes",
        ("User's usual coffee order is {v}.", "Coffee runs: the user drinks {v}."),
        ("User: I've switched from {old} to {v}, remember that for coffee runs.",
         "User: no more {old} for me, it's {v} now."),
        _shuffled(("an oat flat white", "a cortado", "a decaf oat latte", "a double espresso", "an iced americano")),
        "what should I pick up for them at the café?",
    ),
    _ChainSpec(
        "messages", ("food", "health"), ("diet",), ("note", "note"), "notes",
        ("User follows a {v} diet; check menus before booking restaurants.",),
        ("User is {v} now (previously {old}); update the restaurant shortlist.",
         "Diet change: the user went from {old} to {v}."),
        lambda w, ts, ex: list(w.rng.choice(
            (("vegetarian", "pescatarian", "flexitarian"), ("vegan", "vegetarian", "pescatarian"),
             ("pescatarian", "vegetarian", "vegan"), ("flexitarian", "vegetarian", "vegan"))
        )[: len(ts)]),
        "can I cook salmon when they come round for dinner?",
    ),
    _ChainSpec(
        "messages", ("health",), ("fitness", "schedule"), ("note", "text"), "calendar",
        ("User trains at the gym {v}; don't book meetings over it.",),
        ("Gym schedule changed: now {v} instead of {old}.",
         "User moved their workouts from {old} to {v}."),
        _shuffled(("Mon/Wed/Fri at 07:00", "Tue/Thu at 18:30", "Mon/Thu at 12:15", "Sat/Sun at 09:00")),
        "when do they exercise, so I don't schedule things on top of it?",
    ),
    _ChainSpec(
        "messages", ("travel",), ("flights",), ("note", "note"), "email",
        ("Flight to {dest} booked: {v}, seat {seat}.",),
        ("Rebooked the {dest} flight: now {v} (was {old}).",
         "Airline changed the {dest} flight, new booking {v} replaces {old}."),
        _flight_values, "when am I flying out for the trip to {country}?", ident_kind="flight", extra=_trip,
    ),
    _ChainSpec(
        "messages", ("health",), ("appointments",), ("note", "text"), "calendar",
        ("Dentist appointment with Dr. Okafor on {v}.",),
        ("Dentist appointment moved from {old} to {v}.",
         "Dr. Okafor's practice rescheduled the check-up to {v} (was {old})."),
        _dated(_appointment), "when is my next check-up for my teeth?",
    ),
    _ChainSpec(
        "messages", ("work",), ("meetings", "schedule"), ("note", "text"), "calendar",
        ("Weekly 1:1 with Priya (manager) is on {v}.",),
        ("1:1 with Priya moved to {v} (was {old}).",
         "Priya asked to shift the weekly 1:1 from {old} to {v}."),
        _shuffled(("Thursdays at 10:00", "Wednesdays at 15:00", "Mondays at 11:30", "Fridays at 09:30")),
        "when do I catch up with my boss each week?",
    ),
    _ChainSpec(
        "messages", ("finance", "food"), ("budget",), ("note", "chat"), "notes",
        ("Monthly budget for eating out is {v}.",),
        ("User: let's change the eating-out budget from {old} to {v} a month.",
         "User: set the restaurant budget to {v} per month, {old} wasn't working."),
        _shuffled(("£200", "£250", "£300", "£350", "£400")),
        "how much can I spend on restaurants each month?",
    ),
    _ChainSpec(
        "messages", ("family",), ("relocation",), ("note", "text"), "notes",
        ("Maya (the user's sister) lives in {v}.",),
        ("Maya moved from {old} to {v}; her new address is in the contact card.",
         "User's sister relocated to {v} (she was in {old})."),
        _shuffled(("Leeds", "Bristol", "Manchester", "Glasgow", "Cardiff", "Norwich")),
        "which city is my sibling based in these days?",
    ),
    _ChainSpec(
        "messages", ("family",), ("school", "schedule"), ("note", "text"), "email",
        ("Leo's school pickup is at {v} on weekdays.",),
        ("Leo's pickup time changed from {old} to {v} with the new term.",
         "School email: pickup moves to {v} (it was {old})."),
        _ascending(("15:00", "15:15", "15:30", "15:45", "16:00")),
        "what time do I need to collect my son from class?",
    ),
    _ChainSpec(
        "messages", ("finance",), ("insurance", "car"), ("note", "note"), "email",
        ("Car insurance is with {v}; it renews every March.",),
        ("Switched car insurance from {old} to {v}; the new policy documents are in the email folder.",
         "Car now insured with {v} instead of {old}."),
        _shuffled(("Allianz", "Aviva", "Direct Line", "Admiral", "LV=")),
        "who covers the vehicle policy now?",
    ),
)


def _build_chain(w: _World, spec: _ChainSpec) -> None:
    k = w.rng.choice((2, 3))
    times = w.times(k, gap_days=9)
    extra = spec.extra(w) if spec.extra else {}
    values = spec.values(w, times, extra)
    ident_slots = ("v", "old") if spec.ident_kind else ()
    keys: list[int] = []
    for i, (when, value) in enumerate(zip(times, values)):
        slots = {**extra, "v": value, "old": values[i - 1] if i else ""}
        template = w.rng.choice(spec.first if i == 0 else spec.update)
        text, idents = _fill(template, slots, ident_slots)
        if spec.ident_kind == "flight":
            # The value is "TP1351 on Thursday 12 June"; the identifier is the flight number.
            idents = [v.split(" ", 1)[0] for v in idents]
        keys.append(
            w.add(
                spec.namespace, text, spec.types[0 if i == 0 else 1], when, spec.topics, spec.concepts,
                idents=idents, source=spec.source, supersedes=keys[-1:], grade=2 if i == k - 1 else 1,
            )
        )
    judged = {key: (2 if i == k - 1 else 1) for i, key in enumerate(keys)}
    w.paraphrases.append(_QuerySpec(spec.question.format(**extra), spec.namespace, "paraphrase", judged))
    if spec.ident_kind:
        for i, key in enumerate(keys):
            ident = w.drafts[key].idents
            value = values[i].split(" ", 1)[0] if spec.ident_kind == "flight" else values[i]
            assert value in ident
            # Judged best: the newest memory that mentions it (it says where the value stands now).
            mentioning = [kk for kk in keys if value in w.drafts[kk].idents]
            w.ident(value, spec.namespace, spec.ident_kind, mentioning[-1])


# --------------------------------------------------------------------------- #
# conflicting pairs
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _ConflictSpec:
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
    extra: Callable[[_World], dict[str, str]] | None = None


_CONFLICTS: tuple[_ConflictSpec, ...] = (
    _ConflictSpec(
        "code", ("deploy",), ("deploy-window", "release"), ("decision", "text"), ("adr", "wiki"),
        ("Decision: production deploys happen {v} only; anything outside that window needs an approved exception.",
         "Agreed in the release sync: the prod deploy window is {v}."),
        ("The SRE handbook says the production deploy window is {v}.",
         "{eng} told the new hires that prod deploys go out {v}."),
        ("Tue/Thu 14:00-16:00 UTC", "Mon-Wed 09:00-11:00 UTC", "weekdays 13:00-15:00 UTC", "Wednesdays 16:00-18:00 UTC"),
        "what did we decide about the deploy window?", grades=(2, 1),
        extra=lambda w: {"eng": w.rng.choice(_ENGINEERS)},
    ),
    _ConflictSpec(
        "code", ("deploy",), ("release", "code-freeze"), ("text", "text"), ("wiki", "slack"),
        ("The release calendar has the Q3 code freeze starting {v}.",),
        ("{eng} says the code freeze begins {v}, not what the calendar shows.",),
        ("1 August", "4 August", "11 August", "15 August"),
        "when does the code freeze start?", extra=lambda w: {"eng": w.rng.choice(_ENGINEERS)},
    ),
    _ConflictSpec(
        "code", ("billing",), ("ownership",), ("text", "text"), ("wiki", "slack"),
        ("CODEOWNERS lists the {v} team as owner of billing-service.",),
        ("The service catalog says billing-service belongs to {v}.",),
        ("Payments", "Platform", "Growth", "Core API"),
        "which team is responsible for billing-service?",
    ),
    _ConflictSpec(
        "code", ("api",), ("limits",), ("text", "text"), ("wiki", "slack"),
        ("Max attachment upload is {v}, enforced by client_max_body_size in nginx.",),
        ("The public API docs promise attachments up to {v}.",),
        ("10 MB", "25 MB", "50 MB", "100 MB"),
        "how large can an uploaded file be?",
    ),
    _ConflictSpec(
        "code", ("deploy",), ("feature-flags",), ("text", "text"), ("slack", "wiki"),
        ("The new_checkout feature flag is {v} in prod.",),
        ("According to the flag dashboard, new_checkout is {v} in prod.",),
        ("enabled for 100% of users", "enabled for 10% of users", "disabled", "enabled for staff only"),
        "is the new checkout flow switched on for customers?",
    ),
    _ConflictSpec(
        "code", ("ci",), ("nodejs",), ("text", "text"), ("ci", "pr-review"),
        ("The web-frontend CI job runs on {v}.",),
        ("The .nvmrc in the web repo pins {v}.",),
        ("Node 18", "Node 20", "Node 22"),
        "which JavaScript runtime version does the frontend build use?",
    ),
    _ConflictSpec(
        "messages", ("family",), ("birthdays",), ("note", "chat"), ("notes", "chat"),
        ("Mom (Elena) has her birthday on {v}.",),
        ("User: mom's birthday is on {v}, right? Put it in the calendar.",),
        ("12 March", "14 March", "16 March", "18 March"),
        "when should I send birthday wishes to my mother?",
    ),
    _ConflictSpec(
        "messages", ("social",), ("books", "schedule"), ("note", "chat"), ("notes", "chat"),
        ("Book club meets on the {v} at Aisha's flat.",),
        ("Jonas: book club is on the {v}, see you there!",),
        ("first Thursday of the month", "second Wednesday of the month", "last Friday of the month"),
        "when does the reading group get together?",
    ),
    _ConflictSpec(
        "messages", ("social", "food"), ("reservations",), ("note", "chat"), ("email", "chat"),
        ("Anniversary dinner at {rest} is booked for {v}.",),
        ("Sam: I thought our table at {rest} was at {v}?",),
        ("19:00", "19:30", "20:00", "20:30"),
        "what time is the anniversary dinner?",
        extra=lambda w: {"rest": w.rng.choice(("Padella", "Brat", "Rovi", "Kiln", "Bao Borough"))},
    ),
    _ConflictSpec(
        "messages", ("food", "health"), ("allergies", "diet"), ("note", "chat"), ("notes", "chat"),
        ("Sam is allergic to {v}; check ingredients when ordering.",),
        ("User: remember Sam can't have {v}.",),
        ("peanuts", "tree nuts", "shellfish", "sesame"),
        "what food does my partner react badly to?",
    ),
    _ConflictSpec(
        "messages", ("travel",), ("hotels",), ("note", "text"), ("email", "assistant"),
        ("Hotel in {city}: check-in from {v}.",),
        ("The booking site says check-in at the {city} hotel starts at {v}.",),
        ("13:00", "14:00", "15:00", "16:00"),
        "what time can we drop our bags at the hotel in {city}?",
        extra=lambda w: {"city": w.rng.choice(("Edinburgh", "Bath", "York", "Brighton"))},
    ),
)


def _build_conflict(w: _World, spec: _ConflictSpec) -> None:
    extra = spec.extra(w) if spec.extra else {}
    va, vb = w.rng.sample(list(spec.pool), 2)
    ta, tb = w.times(2, gap_days=2)
    a = w.add(
        spec.namespace, w.rng.choice(spec.a).format(v=va, **extra), spec.types[0], ta, spec.topics, spec.concepts,
        source=spec.sources[0], grade=spec.grades[0] if spec.types[0] == "decision" else 1,
    )
    b = w.add(
        spec.namespace, w.rng.choice(spec.b).format(v=vb, **extra), spec.types[1], tb, spec.topics, spec.concepts,
        source=spec.sources[1], conflicts=[a],
    )
    w.topical.append(
        _QuerySpec(spec.question.format(**extra), spec.namespace, "topical", {a: spec.grades[0], b: spec.grades[1]})
    )


# --------------------------------------------------------------------------- #
# incidents: log lines supporting a conclusion
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _IncidentSpec:
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


_INCIDENTS: tuple[_IncidentSpec, ...] = (
    _IncidentSpec(
        "ERR_CONN_RESET", "checkout-api", ("incidents", "database"), ("postgres", "pgbouncer", "latency"),
        ("web", True), ("pgbouncer", False), "deploy/pgbouncer/pgbouncer.ini",
        ("{ts} {host} checkout-api[{pid}]: ERROR query failed: {code} while reading from {aux}:6432 (attempt 3/3)",
         "{ts} {host} checkout-api[{pid}]: WARN connection pool drained after {code} burst, 37 requests queued"),
        "Postmortem {ticket}: the {code} spikes on checkout-api came from pgbouncer on {aux} closing idle server "
        "connections before the client keepalive expired. Fix: server_idle_timeout raised to 600s in {path}.",
        "why did checkout requests randomly fail while talking to the database?",
    ),
    _IncidentSpec(
        "OOMKilled", "image-worker", ("incidents", "performance"), ("kubernetes", "memory"),
        ("node", False), ("worker", False), "src/worker/thumbnails.py",
        ("{ts} kubelet {host}: container image-worker in pod image-worker-7d9f{hex} was {code} (limit 512Mi)",
         "{ts} kubelet {host}: pod image-worker-7d9f{hex} restarted 6 times in 20 minutes, last state {code}"),
        "{ticket}: image-worker pods were {code} because {path} kept every decoded thumbnail in an unbounded dict. "
        "Capped the cache at 256 entries and raised the memory limit to 1Gi.",
        "why did the photo processing pods keep dying?", major=1,
    ),
    _IncidentSpec(
        "E1042", "payments-webhook", ("incidents", "auth"), ("webhooks", "secrets"),
        ("payments", True), ("vault", False), "deploy/secrets/payments.sops.yaml",
        ("{ts} {host} payments-webhook[{pid}]: {code} signature verification failed for event evt_{hex}",),
        "{ticket}: {code} webhook failures started right after the signing secret was rotated at the provider but not "
        "in {path}. Re-synced the secret and added an alert when {code} exceeds 5 per minute.",
        "why were the payment provider's callbacks being rejected?",
    ),
    _IncidentSpec(
        "CrashLoopBackOff", "api", ("incidents", "deploy"), ("kubernetes", "helm"),
        ("node", False), ("api", False), "deploy/helm/values.yaml",
        ("{ts} kubelet {host}: Back-off restarting failed container api in pod api-{hex}: {code}",
         "{ts} {aux} api[1]: KeyError: 'DATABASE_URL' during startup, exiting"),
        "{ticket}: api went into {code} after the {version} release because {path} lost the DATABASE_URL env entry "
        "in the chart refactor. Rolled back, then restored the env block.",
        "why did the api pods keep restarting right after the release?", major=3,
    ),
    _IncidentSpec(
        "ERR_TLS_HANDSHAKE_TIMEOUT", "auth-service", ("incidents", "auth"), ("tls", "certificates"),
        ("ingress", True), ("auth", True), "deploy/cert-manager/issuer-prod.yaml",
        ("{ts} {host} envoy[{pid}]: upstream connect error {code} to {aux}:443",),
        "{ticket}: {code} on login was an expired intermediate certificate on {host}; the renewal configured in "
        "{path} was stuck on a rate-limited ACME order. Renewed by hand and added expiry alerts at 21 days.",
        "why could nobody sign in until a certificate got renewed?",
    ),
    _IncidentSpec(
        "53300", "reporting-job", ("incidents", "database"), ("postgres", "connections"),
        ("db", False), ("reports", False), "src/reports/export.py",
        ("{ts} {host} postgres[{pid}]: FATAL: {code}: sorry, too many clients already",
         "{ts} {host} postgres[{pid}]: LOG: connection received from reporting-job, 497 of 500 slots used"),
        "{ticket}: the nightly reporting job opened one connection per exported row, so Postgres on {host} ran out of "
        "slots (SQLSTATE {code}). {path} now uses the pooled DSN and a single connection.",
        "the export job exhausted the database's client slots overnight", major=1,
    ),
    _IncidentSpec(
        "ImagePullBackOff", "search-indexer", ("incidents", "ci"), ("kubernetes", "rate-limiting"),
        ("node", False), ("registry", True), "ci/mirror-images.yaml",
        ("{ts} kubelet {host}: Failed to pull image \"{aux}/search-indexer:{version}\": {code} (429 Too Many Requests)",),
        "{ticket}: {code} during the {version} rollout was Docker Hub throttling pulls of our base image; CI now "
        "mirrors base images into {aux} ({path}).",
        "why couldn't the cluster fetch container images during a rollout?", major=0,
    ),
    _IncidentSpec(
        "E2210", "search-indexer", ("incidents", "search"), ("elasticsearch",),
        ("search", True), ("es", False), "search/mappings/products.json",
        ("{ts} {host} search-indexer[{pid}]: {code} mapper_parsing_exception on field 'price' (expected float, got keyword)",),
        "{ticket}: the {code} indexing errors came from {path} typing price as keyword. Reindexed into a fresh index "
        "with the corrected mapping and swapped the alias.",
        "product search stopped picking up price changes",
    ),
    _IncidentSpec(
        "ETIMEDOUT", "notifications", ("incidents", "infra"), ("dns", "latency"),
        ("notify", True), ("coredns", False), "deploy/coredns/Corefile",
        ("{ts} {host} notifications[{pid}]: getaddrinfo {code} smtp-relay.internal",
         "{ts} {aux} coredns[1]: [ERROR] plugin/forward: no healthy upstreams"),
        "{ticket}: {code} errors in notifications were CoreDNS on {aux} losing its upstream resolvers. Bumped CoreDNS "
        "to 3 replicas, changed the forwarders in {path} and added a node-local DNS cache.",
        "emails were not going out because name lookups kept failing",
    ),
    _IncidentSpec(
        "LEADER_NOT_AVAILABLE", "order-events-consumer", ("incidents", "infra"), ("kafka",),
        ("consumer", True), ("broker", True), "runbooks/kafka-rolling-restart.md",
        ("{ts} {host} order-events-consumer[{pid}]: WARN Error while fetching metadata: {{orders={code}}}",),
        "{ticket}: the consumer lag spike was a rolling restart of {aux} that left partitions without a leader "
        "({code}) for about 4 minutes. {path} now waits for the ISR to recover between brokers.",
        "order processing stalled while the event brokers were being restarted",
    ),
    _IncidentSpec(
        "ERR_RATE_LIMITED", "release-pipeline", ("incidents", "ci"), ("rate-limiting", "github"),
        ("runner", False), ("ci", False), ".github/workflows/release.yml",
        ("{ts} {host} release[{pid}]: step 'publish' failed: {code} from api.github.com (remaining=0, reset in 2040s)",),
        "{ticket}: release pipeline failures were {code} responses from the GitHub API because {path} fell back to an "
        "unauthenticated token. Switched to the GitHub App token.",
        "why did the release pipeline fail when talking to GitHub?",
    ),
)

_FOLLOWUPS = (
    "{ticket} closed: the fix shipped in {version} and {code} has not shown up for seven days.",
    "Follow-up on {ticket}: {version} is out with the permanent fix; added a regression test.",
    "{ticket} resolved in {version}. Keeping the dashboard alert for {code} as a tripwire.",
)


def _build_incident(w: _World, spec: _IncidentSpec) -> None:
    t0 = w.at(hi=_END - timedelta(days=20))
    slots = {
        "code": spec.code,
        "host": w.host(*spec.host_role),
        "aux": w.host(*spec.aux_role),
        "path": w.pick((spec.path,)),
        "ticket": w.ticket(),
        "version": w.version(spec.major),
        "pid": str(w.rng.randint(1200, 48000)),
        "hex": "".join(w.rng.choice("0123456789abcdef") for _ in range(5)),
    }
    if spec.aux_role[0] == "registry":
        slots["aux"] = slots["aux"].replace(".internal", ".example.com")
    n_logs = w.rng.choice((1, 2)) if len(spec.logs) > 1 else 1
    logs: list[int] = []
    for i in range(n_logs):
        when = t0 + timedelta(minutes=7 * i, seconds=w.rng.randint(1, 59))
        text, idents = _fill(spec.logs[i], {**slots, "ts": _iso(when)})
        logs.append(
            w.add("code", text, "log", when, spec.topics, spec.concepts, idents, "loki",
                  extra_meta={"service": spec.service})
        )
    done = t0 + timedelta(days=w.rng.randint(1, 4), hours=w.rng.randint(1, 8))
    text, idents = _fill(spec.conclusion, slots)
    conclusion = w.add("code", text, "text", done, spec.topics, spec.concepts, idents, "postmortem",
                       supported_by=logs, grade=2)
    judged = {conclusion: 2, **{k: 1 for k in logs}}
    if w.rng.random() < 0.6:
        text, idents = _fill(w.rng.choice(_FOLLOWUPS), slots)
        later = done + timedelta(days=w.rng.randint(3, 12))
        judged[w.add("code", text, "text", later, spec.topics[:1], spec.concepts[:1], idents, "jira")] = 1
    w.ident(spec.code, "code", "error", conclusion)
    w.ident(slots["ticket"], "code", "ticket", conclusion)
    w.ident(slots["host"], "code", "host", logs[0])
    w.optional_paraphrases.append(_QuerySpec(spec.question, "code", "paraphrase", judged))


# --------------------------------------------------------------------------- #
# code namespace: the everyday memories
# --------------------------------------------------------------------------- #

_SERVICES = (
    ("checkout-api", 2), ("billing-service", 1), ("auth-service", 3), ("search-indexer", 0), ("image-worker", 1),
    ("notifications", 2), ("web-frontend", 5), ("admin-portal", 1), ("order-events-consumer", 2), ("reporting-job", 1),
)

_DEPLOY_EXTRAS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("; canary held at 10% for 30 minutes with no change in error rate", ("canary",)),
    (", rolled back 20 minutes later when p99 latency doubled", ("latency", "rollback")),
    (" with the new migration behind a flag; the backfill runs separately tonight", ("migrations",)),
    (". Smoke tests green and the dashboards stayed quiet", ()),
    ("; needed a manual helm rollback of the config map first", ("helm", "rollback")),
    (" during the freeze, with an approved exception from the release manager", ("release", "code-freeze")),
    (". First deploy through the new Argo CD pipeline", ("gitops",)),
    (", slow because the image wasn't cached on the new nodes (14 minutes)", ("kubernetes",)),
    ("; watch the cache hit rate, the key format changed", ("redis",)),
    (" after the dependency bump for the openssl CVE", ("security",)),
    (". Error budget for the month is now at 40%", ("slo",)),
    ("; the feature flag stays off until support is briefed", ("feature-flags",)),
)

_DEPLOY_TEMPLATES = (
    "Deployed {service} {version} to {env}{extra}.",
    "{service} {version} is live in {env}{extra}.",
    "Shipped {service} {version} ({env}){extra}.",
    "{Env} now runs {service} {version}{extra}.",
)


def _build_deploys(w: _World, n: int) -> None:
    combos = [(s, e) for s in range(len(_SERVICES)) for e in range(len(_DEPLOY_EXTRAS))]
    for si, ei in w.rng.sample(combos, n):
        service, major = _SERVICES[si]
        extra, concepts = _DEPLOY_EXTRAS[ei]
        env = w.rng.choice(("prod", "prod", "staging", "canary"))
        slots = {"service": service, "version": w.version(major), "env": env, "Env": _cap(env), "extra": extra}
        text, idents = _fill(w.rng.choice(_DEPLOY_TEMPLATES), slots)
        key = w.add("code", text, "text", w.at(), ("deploy",), concepts[:3], idents, "ci",
                    extra_meta={"service": service, "env": env})
        w.ident(slots["version"], "code", "version", key)


# (path, comment, topics, concepts)
_REVIEWS: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("src/app/main.py", "startup does a blocking DNS lookup for every upstream; make it lazy or cold starts stay slow.",
     ("performance",), ("latency", "dns")),
    ("src/app/routes/orders.py", "pagination uses OFFSET on a 40M-row table; switch to keyset pagination on (created_at, id).",
     ("database", "performance"), ("postgres", "latency")),
    ("src/app/db/session.py", "sessions are never closed on the exception path; use a context manager or we leak connections.",
     ("database",), ("postgres",)),
    ("src/auth/jwt.py", "we accept alg=none when the header says so; pin the algorithm list to RS256.",
     ("auth", "security"), ("jwt",)),
    ("src/auth/oauth_callback.py", "the state parameter is compared with ==, use hmac.compare_digest.",
     ("auth", "security"), ()),
    ("src/billing/invoice.py", "rounding happens per line item and again on the total, so customers see 1-cent mismatches.",
     ("billing",), ()),
    ("src/billing/tax.py", "tax rates are hardcoded for 2024; load them from the rates table so January doesn't need a deploy.",
     ("billing",), ()),
    ("src/search/query_builder.py", "user input is concatenated into the query DSL; escape reserved characters or use a match query.",
     ("search", "security"), ("elasticsearch",)),
    ("src/worker/queue.py", "retries have no jitter, so after an outage every job retries in lockstep.",
     ("performance",), ("retries",)),
    ("src/app/middleware/ratelimit.py", "the limiter keys on the client IP, which is the load balancer behind the proxy; "
     "read X-Forwarded-For from the trusted hop.", ("api",), ("rate-limiting",)),
    ("src/notifications/email.py", "templates render inside the DB transaction; render first, then open the transaction.",
     ("performance",), ("postgres",)),
    ("web/src/components/CheckoutForm.tsx", "the submit button isn't disabled while the request is in flight; "
     "double clicks create two orders.", ("frontend",), ()),
    ("web/src/hooks/useSession.ts", "token refresh fires on every render; memoize it or we hit /token 30 times per page.",
     ("frontend", "auth"), ("jwt",)),
    ("migrations/0042_add_order_index.sql", "CREATE INDEX without CONCURRENTLY will lock the orders table for minutes in prod.",
     ("database",), ("postgres", "migrations")),
    ("migrations/0057_drop_legacy_sessions.sql", "drop the table one release after removing the code that reads it, "
     "not in the same deploy.", ("database", "deploy"), ("migrations",)),
    ("scripts/backfill_orders.py", "the backfill loads every order into memory at once; batch it by 10k ids.",
     ("database",), ("memory",)),
    ("src/app/cache.py", "cache keys don't include the tenant id, so two tenants can read each other's settings.",
     ("security",), ("redis",)),
    ("src/app/health.py", "the liveness probe checks the database, so a DB blip restarts every pod; keep liveness "
     "shallow and move the DB check to readiness.", ("infra",), ("kubernetes",)),
    ("src/auth/password_reset.py", "reset tokens never expire; give them a 30-minute TTL and make them single use.",
     ("auth", "security"), ()),
    ("src/app/logging_config.py", "we log full request bodies at INFO, including card numbers on the payment route.",
     ("security", "observability"), ("logging",)),
    ("tests/integration/test_checkout.py", "the test sleeps 5 seconds waiting for the worker; poll with a timeout instead.",
     ("ci",), ("flaky-tests",)),
    ("docker/api.Dockerfile", "pip install runs after COPY . so every code change busts the dependency layer cache.",
     ("ci",), ("docker",)),
    (".github/workflows/ci.yml", "the matrix runs four Python versions on every push; keep the full matrix for main only.",
     ("ci",), ("python",)),
    ("src/reports/scheduler.py", "the cron expression is in local time but the servers are UTC, so the report runs at "
     "01:00 instead of 09:00.", ("infra",), ()),
)

_REVIEW_TEMPLATES = (
    "Review of PR {pr} ({path}): {comment}",
    "Left a comment on PR {pr}: in {path}, {comment}",
    "Code review note for {path}: {comment}",
    "PR {pr} needs changes. {path}: {comment}",
)

# (path, snippet sentence, topics, concepts): memories of content type "code"
_SNIPPETS: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("src/app/repositories/users.py", "use `session.execute(text(sql), params)` instead of an f-string; the f-string "
     "version is injectable.", ("security", "database"), ("postgres",)),
    ("src/common/retry.py", "`delay = min(cap, base * 2 ** attempt) * random.uniform(0.5, 1.5)`; the jitter is the point.",
     ("performance",), ("retries",)),
    ("deploy/helm/templates/deployment.yaml", "`readinessProbe: {httpGet: {path: /readyz, port: 8081}, periodSeconds: 5}`",
     ("infra",), ("kubernetes", "helm")),
    ("src/app/db/engine.py", "`create_engine(url, pool_size=10, max_overflow=5, pool_pre_ping=True)`",
     ("database",), ("postgres",)),
    ("src/auth/verify.py", "`jwt.decode(token, key, algorithms=[\"RS256\"], audience=\"api\")`; never take the algorithm "
     "from the token header.", ("auth",), ("jwt",)),
    ("src/common/logs.py", "`structlog.configure(processors=[add_log_level, TimeStamper(fmt=\"iso\"), JSONRenderer()])`",
     ("observability",), ("logging",)),
    ("src/billing/charges.py", "`INSERT INTO charges (...) ON CONFLICT (idempotency_key) DO NOTHING RETURNING id` keeps "
     "retried webhooks from charging twice.", ("billing", "database"), ("postgres", "webhooks")),
    ("src/worker/main.py", "`signal.signal(signal.SIGTERM, drain)`: stop taking jobs and finish in-flight ones within "
     "terminationGracePeriodSeconds.", ("infra",), ("kubernetes",)),
)

_SNIPPET_TEMPLATES = ("In {path}: {snippet}", "Snippet from {path}: {snippet}", "Pattern we use in {path}: {snippet}")

# (command sentence, topics, concepts, host slots needed as (role, internal))
_COMMANDS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("tail the prod api logs: `kubectl -n prod logs deploy/api -f --since=15m`", ("observability",), ("kubernetes",)),
    ("open a read-only psql shell on the analytics replica: `psql \"host={host} dbname=app user=readonly sslmode=require\"`",
     ("database",), ("postgres",)),
    ("restart image-worker without downtime: `kubectl -n prod rollout restart deploy/image-worker`",
     ("deploy",), ("kubernetes",)),
    ("flush the staging rate limiter keys: `redis-cli -h {host} --scan --pattern 'rl:*' | xargs redis-cli -h {host} del`",
     ("api",), ("redis", "rate-limiting")),
    ("check pgbouncer pools: `psql -p 6432 -U pgbouncer pgbouncer -c 'SHOW POOLS;'`", ("database",), ("pgbouncer",)),
    ("re-run a failed CI job with debug logging: `gh run rerun <run-id> --debug`", ("ci",), ("github",)),
    ("diff a helm release before upgrading: `helm diff upgrade api ./deploy/helm -f deploy/helm/values-prod.yaml`",
     ("deploy",), ("helm",)),
    ("find the slowest queries: `SELECT query, mean_exec_time FROM pg_stat_statements ORDER BY mean_exec_time DESC LIMIT 20;`",
     ("database", "performance"), ("postgres", "latency")),
    ("renew a certificate by hand: `cmctl renew api-tls -n ingress`", ("auth",), ("tls", "certificates")),
    ("check consumer lag: `kafka-consumer-groups --bootstrap-server {host}:9092 --describe --group order-events`",
     ("infra",), ("kafka",)),
    ("rebuild the product search index: `make reindex INDEX=products ALIAS=products-live`", ("search",), ("elasticsearch",)),
    ("reach Grafana locally: `kubectl -n monitoring port-forward svc/grafana 3000:80`", ("observability",), ("kubernetes",)),
    ("generate a migration: `alembic revision --autogenerate -m \"add orders index\"`", ("database",), ("migrations",)),
    ("run the unit tests the way CI does: `tox -e py311 -- -x -q`", ("ci",), ("python",)),
    ("rotate the staging signing keys: `./scripts/rotate_keys.sh --env staging --dry-run`, then again without --dry-run",
     ("auth", "security"), ("secrets",)),
    ("see why a node is under pressure: `kubectl describe node {host} | grep -A5 Conditions`", ("infra",), ("kubernetes",)),
    ("prune stale preview environments: `./scripts/prune_previews.sh --older-than 7d`", ("ci",), ("preview-envs", "budget")),
    ("query Loki for checkout 5xx: `{{app=\"checkout-api\"}} |= \"status=5\" | logfmt`", ("observability",), ("logging",)),
    ("dump one table from staging: `pg_dump -h {host} -t orders --data-only app > orders.sql`", ("database",), ("postgres",)),
    ("check which pods use the most memory: `kubectl top pods -n prod --sort-by=memory | head`",
     ("performance",), ("kubernetes", "memory")),
)

_COMMAND_HOSTS = {1: ("db", False), 3: ("cache", True), 9: ("kafka", True), 15: ("node", False), 18: ("db", False)}
_COMMAND_TEMPLATES = ("Runbook: to {cmd}", "Handy command to {cmd}", "How to {cmd}", "To {cmd}")

# (decision, topics, concepts)
_DECISIONS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("schema migrations go through Alembic only; no manual DDL in production, ever.", ("database",), ("migrations",)),
    ("all services emit JSON logs with a request_id field; plain-text logging fails review.",
     ("observability",), ("logging",)),
    ("we stay on managed Postgres instead of running it on Kubernetes; the on-call burden isn't worth the savings.",
     ("database", "infra"), ("postgres", "kubernetes")),
    ("feature flags older than 90 days get removed or turned into permanent config.", ("deploy",), ("feature-flags",)),
    ("Q3 cloud spend is capped at $42k/month; anything above needs a FinOps review.", ("infra",), ("budget", "cost")),
    ("secrets live in Vault; a .env file committed to a repo fails the pre-commit hook.", ("security",), ("secrets",)),
    ("the p99 latency SLO for checkout-api is 400 ms, measured at the load balancer.", ("performance",), ("latency", "slo")),
    ("every incident with customer impact gets a written postmortem within 5 working days.",
     ("incidents",), ("postmortems",)),
    ("base images are pinned by digest, never by tag.", ("ci", "security"), ("docker",)),
    ("mobile API v1 endpoints stay until March 2026; deprecation headers start going out now.", ("api",), ("api-versioning",)),
    ("integration tests run against a real Postgres in CI via testcontainers, not SQLite.", ("ci", "database"), ("postgres",)),
    ("traces are sampled at 5% except errors, which are always kept, to stay inside the observability budget.",
     ("observability",), ("tracing", "budget")),
)

_DECISION_TEMPLATES = ("Decision: {d}", "We decided: {d}", "ADR accepted: {d}", "Agreed in the architecture sync: {d}")

# (fact, topics, concepts)
_CONFIG_FACTS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("checkout-api's liveness endpoint is /healthz on port 8081; the load balancer uses /readyz.", ("infra",), ("kubernetes",)),
    ("Postgres statement_timeout for the api role is 15s; the reports role gets 5 minutes.", ("database",), ("postgres",)),
    ("default outbound HTTP timeouts are 3s connect and 20s read, set in the shared client factory.",
     ("performance",), ("latency",)),
    ("Sentry environments are prod, staging and preview-*; events from anything else are dropped.",
     ("observability",), ("sentry",)),
    ("the staging cluster scales to zero between 22:00 and 06:00 UTC to save money.", ("infra",), ("kubernetes", "budget")),
    ("preview environments are created per PR and deleted after 7 days without activity.", ("ci", "deploy"), ("preview-envs",)),
    ("the Grafana dashboard 'API / Latency' is the source of truth for SLO reviews.", ("observability",), ("latency", "slo")),
    ("refresh tokens are stored hashed; revoking one is a row delete.", ("auth",), ("jwt",)),
    ("the search cluster has 3 data nodes and 1 replica per shard.", ("search", "infra"), ("elasticsearch",)),
    ("billing webhooks are retried up to 8 times with exponential backoff over 24 hours.", ("billing",), ("webhooks", "retries")),
    ("cron jobs run in UTC; the reporting job fires at 06:30 UTC.", ("infra",), ("schedule",)),
    ("CI caches pip wheels keyed on the hash of requirements.lock.", ("ci",), ("python",)),
    ("image tags are the short git SHA; 'latest' is never deployed.", ("deploy", "ci"), ("docker",)),
    ("rate limiter state lives in Redis with a 60-second sliding window.", ("api",), ("redis", "rate-limiting")),
    ("the admin-portal only accepts logins through the company SSO; no local passwords.", ("auth",), ("sso",)),
)

_CONFIG_TEMPLATES = ("FYI: {f}", "Note: {f}", "For reference, {f}", "Worth knowing: {f}")

# (note, topics, concepts); {eng} and {eng2} are engineers, {date} a day
_DEV_NOTES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("{eng} is out from {date} for a week; {eng2} covers billing reviews.", ("team",), ()),
    ("Flaky: test_refund_partial fails when it runs after test_tax_rounding because both mutate the shared fixture.",
     ("ci",), ("flaky-tests",)),
    ("Staging is broken on Thursdays after the data refresh until the search reindex finishes, about 40 minutes.",
     ("infra", "search"), ("elasticsearch", "staging")),
    ("Onboarding tip: ask {eng} for access to the prod read replica; it needs an approved request.",
     ("team", "database"), ("postgres", "access")),
    ("The load test on {date} topped out at 2,300 rps before checkout-api's p99 went past 400 ms.",
     ("performance",), ("latency", "load-testing")),
    ("The old Jenkins server has been read-only since February; every pipeline is in GitHub Actions now.", ("ci",), ("github",)),
    ("SOC 2 evidence for the quarterly access review is due by {date}.", ("security",), ("compliance",)),
    ("Fixed the N+1 in the orders list endpoint: prefetching line items cut it from 201 queries to 3.",
     ("performance", "database"), ("postgres", "latency")),
    ("{eng} is the person who understands the legacy billing cron; ask before touching it.", ("billing", "team"), ()),
    ("Game day on {date}: kill one Kafka broker in staging and watch how the consumers recover.", ("incidents",), ("kafka",)),
    ("Dependabot PRs get merged in one batch on Mondays to keep the noise down.", ("ci",), ("dependencies",)),
    ("The design doc for multi-region writes is parked until after the Q3 freeze.", ("infra",), ("code-freeze",)),
    ("{eng} and {eng2} pair on the search relevance work on Tuesdays.", ("team", "search"), ()),
    ("Customer support wants a heads-up in #support-releases before anything user-visible ships.", ("deploy",), ("release",)),
)


def _build_code_everyday(w: _World) -> None:
    _build_deploys(w, 40)
    for path, comment, topics, concepts in w.rng.sample(list(_REVIEWS), len(_REVIEWS)):
        slots = {"pr": w.pr(), "path": w.pick((path,)), "comment": comment}
        text, idents = _fill(w.rng.choice(_REVIEW_TEMPLATES), slots)
        key = w.add("code", text, "text", w.at(), topics, concepts, idents, "pr-review")
        w.ident(path, "code", "path", key)
    for path, snippet, topics, concepts in _SNIPPETS:
        slots = {"path": w.pick((path,)), "snippet": snippet}
        text, idents = _fill(w.rng.choice(_SNIPPET_TEMPLATES), slots)
        key = w.add("code", text, "code", w.at(), topics, concepts, idents, "pr-review")
        w.ident(path, "code", "path", key)
    for i, (cmd, topics, concepts) in enumerate(_COMMANDS):
        slots = {"host": w.host(*_COMMAND_HOSTS[i])} if i in _COMMAND_HOSTS else {}
        cmd_text, idents = _fill(cmd, slots)
        text = w.rng.choice(_COMMAND_TEMPLATES).format(cmd=cmd_text)
        key = w.add("code", text, "code", w.at(), topics, concepts, idents, "runbook")
        for ident in idents:
            w.ident(ident, "code", "host", key)
    for d, topics, concepts in _DECISIONS:
        text = w.rng.choice(_DECISION_TEMPLATES).format(d=d)
        w.add("code", text, "decision", w.at(), topics, concepts, source="adr", grade=2)
    for f, topics, concepts in _CONFIG_FACTS:
        text = w.rng.choice(_CONFIG_TEMPLATES).format(f=f)
        w.add("code", text, "text", w.at(), topics, concepts, source="wiki")
    for note, topics, concepts in _DEV_NOTES:
        when = w.at()
        eng, eng2 = w.rng.sample(_ENGINEERS, 2)
        text = note.format(eng=eng, eng2=eng2, date=_day(when + timedelta(days=w.rng.randint(3, 20))))
        w.add("code", text, "text", when, topics, concepts, source="slack")


# --------------------------------------------------------------------------- #
# messages namespace
# --------------------------------------------------------------------------- #

_FRIENDS = ("Jonas", "Aisha", "Kwame", "Mei", "Tomás", "Ravi")

# (person note, topics, concepts)
_PEOPLE: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("Sam (partner) works night shifts at St Thomas' every other week; avoid evening plans on those weeks.",
     ("family",), ("schedule",)),
    ("Leo is the user's son, 9 years old, in Year 4; loves dinosaurs and Minecraft.", ("family",), ()),
    ("Maya is the user's younger sister; she's a nurse and has two cats.", ("family",), ()),
    ("Elena is the user's mom; she prefers phone calls to texts and goes to bed early.", ("family",), ("communication",)),
    ("Priya Raman is the user's manager; direct, likes bullet-point updates.", ("work",), ("communication",)),
    ("Jonas is an old university friend who runs a bike shop in Utrecht.", ("social",), ()),
    ("Aisha hosts the book club and has a dog called Biscuit; she's vegetarian.", ("social",), ("vegetarian", "diet", "books")),
    ("Tomás is a colleague on the data team, the go-to person for dashboards.", ("work",), ()),
    ("Mei is the mum of Leo's best friend; they share the school run on Fridays.", ("family", "social"), ("school",)),
    ("Kwame is the user's running buddy; they do the Sunday long run together.", ("social", "health"), ("fitness",)),
    ("Olivia is the letting agent; contact her about anything broken in the flat.", ("home",), ()),
    ("Grandpa Luis lives in Seville and turns 80 this year.", ("family",), ("birthdays",)),
    ("Hannah from HR handles the parental leave paperwork.", ("work",), ()),
    ("Ravi is the neighbour at number 12 and keeps a spare key.", ("home", "social"), ()),
    ("Chloe is Sam's sister; she's gluten-free, so plan dinners accordingly.", ("family", "food"), ("diet",)),
    ("Ben coaches Leo's Saturday football team.", ("family",), ("football",)),
    ("Nadia was the user's mentor at the previous job; they catch up every quarter.", ("work",), ("meetings",)),
    ("Dr. Okafor is the family dentist at the Camden practice.", ("health",), ("appointments",)),
)

_PEOPLE_TEMPLATES = ("{p}", "Contact note: {p}", "People: {p}")

# (preference, topics, concepts)
_PREFERENCES: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("User prefers window seats on flights longer than three hours.", ("travel",), ("flights",)),
    ("User hates phone calls before 9am; text first.", ("work",), ("communication",)),
    ("User likes spicy food but can't stand coriander.", ("food",), ()),
    ("User's favourite restaurant is Dishoom in King's Cross; always orders the black daal.", ("food",), ("restaurants",)),
    ("User wants meeting reminders 30 minutes ahead, not 10.", ("work",), ("meetings", "reminders")),
    ("User takes the train instead of flying for anything under five hours.", ("travel",), ("trains",)),
    ("User doesn't drink alcohol on weeknights.", ("health",), ()),
    ("User likes hotel rooms on a high floor, away from the lift.", ("travel",), ("hotels",)),
    ("User pays for shared dinners and settles up later on Splitwise.", ("finance",), ("budget",)),
    ("User reads on a Kindle; gift ideas should be ebooks or audiobooks, not paper books.", ("social",), ("gifts", "books")),
    ("User keeps Fridays after 3pm free for deep work.", ("work",), ("schedule",)),
    ("User's pace target for the half marathon is 5:20 per km.", ("health",), ("fitness",)),
    ("User takes oat milk in everything.", ("food",), ("dairy-free",)),
    ("User likes to plan holidays at least three months ahead.", ("travel",), ()),
    ("User wants summaries as bullet points, five at most.", ("work",), ("communication",)),
    ("User doesn't want work notifications at weekends.", ("work",), ("communication",)),
    ("User's shoe size is EU 43; Leo's is EU 33.", ("family",), ("shopping",)),
    ("User books Sainsbury's delivery slots on Sunday mornings.", ("home", "food"), ("groceries",)),
    ("User loves board games, especially Wingspan and Azul.", ("social",), ("games",)),
    ("User keeps gift spending under £50 per person.", ("finance", "social"), ("budget", "gifts")),
    ("User likes quiet tables away from the kitchen when eating out.", ("food",), ("restaurants",)),
)

_PREFERENCE_TEMPLATES = ("{p}", "Preference: {p}", "Noted: {p}")

# (plan with {date} and {friend} slots, topics, concepts)
_PLANS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("Plan: hike Snowdon with {friend} on {date} if the weather holds.", ("social", "travel"), ("hiking",)),
    ("Leo's birthday party at the climbing centre on {date}; 12 kids invited.", ("family",), ("birthdays",)),
    ("Book club on {date}; this month's book is 'Tomorrow, and Tomorrow, and Tomorrow'.", ("social",), ("books",)),
    ("Dinner at Aisha's on {date}; bring a dessert without gelatine.", ("social", "food"), ("vegetarian",)),
    ("Visiting mom on {date}; she asked for help in the garden.", ("family",), ()),
    ("Half marathon on {date}; taper the week before.", ("health",), ("fitness",)),
    ("Sam and the user want a weekend in Bath around {date}.", ("travel", "family"), ()),
    ("Repaint the hallway on {date}; buy the paint the week before.", ("home",), ()),
    ("Quarterly lunch with Nadia on {date}.", ("work",), ("meetings",)),
    ("Khruangbin at Brixton Academy on {date}, tickets are in the email.", ("social",), ("music",)),
    ("Leo's dentist appointment on {date} at 16:00.", ("health", "family"), ("appointments",)),
    ("Car MOT due on {date}; book the garage this week.", ("home",), ("car",)),
    ("Passport renewal must be done before {date}; it expires in the autumn.", ("travel",), ("documents",)),
    ("Team offsite in Brighton on {date}; the user volunteered to find a venue.", ("work",), ("offsite",)),
    ("Film night with Leo on {date}, his pick this time.", ("family",), ()),
    ("Farmers market with Sam on {date} morning.", ("food", "family"), ("groceries",)),
    ("Sign Leo up for swimming lessons before {date}.", ("family",), ("swimming",)),
    ("Grandpa Luis's 80th birthday lunch in Seville on {date}.", ("family", "travel"), ("birthdays",)),
    ("Council tax instalment due {date}.", ("finance",), ("bills",)),
    ("Cancel the gym trial before {date} or it renews at £45/month.", ("finance", "health"), ("budget",)),
    ("Help {friend} move flat on {date}.", ("social",), ()),
    ("Plant tomatoes on the balcony around {date}.", ("home",), ("gardening",)),
    ("Try the new ramen place on Caledonian Road with {friend} on {date}.", ("food", "social"), ("restaurants",)),
    ("Sort out Leo's summer camp registration by {date}.", ("family",), ("school",)),
    ("Call the bank about remortgaging before {date}.", ("finance", "home"), ("mortgage",)),
)

# (travel note with {date} and {booking}, topics, concepts)
_TRAVEL: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("Eurostar to Paris on {date}, coach 7, booking reference {booking}.", ("travel",), ("trains",)),
    ("Rental car in Seville from {date}, pickup at the airport desk, reservation {booking}.", ("travel", "family"), ("car",)),
    ("Travel insurance for the year is with World Nomads, policy {booking}.", ("travel", "finance"), ("insurance",)),
    ("Cottage in the Lake District from {date}, key box by the back door, booking {booking}.", ("travel",), ("hotels",)),
    ("Train to Edinburgh on {date}, seats 42 and 43, reference {booking}.", ("travel",), ("trains",)),
    ("Natural History Museum dinosaur exhibit with Leo on {date}, order {booking}.", ("family",), ("tickets",)),
    ("Ferry to Santander on {date} with a cabin, reference {booking}.", ("travel",), ()),
    ("Theatre tickets for mom: 'Six' at the Vaudeville on {date}, order {booking}.", ("family", "social"), ("gifts", "tickets")),
)

_MEETING_PEOPLE = ("Priya", "Tomás", "Hannah", "Nadia", "the design team", "a vendor from Acme Analytics", "the new analyst")
# (subject, concepts)
_MEETING_SUBJECTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the Q3 roadmap", ()), ("promotion criteria", ("career",)), ("parental leave dates", ("leave",)),
    ("the dashboard migration", ("dashboards",)), ("hiring for the data team", ("hiring",)),
    ("a conference talk proposal", ("career",)), ("the offsite budget", ("budget", "offsite")),
    ("onboarding", ()), ("the vendor contract renewal", ("budget",)), ("performance review prep", ("career",)),
    ("the metrics definitions doc", ("dashboards",)), ("next year's training budget", ("budget", "learning")),
)
_MEETING_PLACES = ("on Zoom", "in the office, 3rd floor", "on Google Meet", "at the café downstairs", "in room Thames")
_MEETING_TEMPLATES = (
    "Meeting with {who} about {subject} on {date} at {time}, {place}.",
    "{Who} wants to talk about {subject}; booked {date}, {time}, {place}.",
    "Calendar: {subject} with {who}, {date} {time}, {place}.",
    "User asked for a call with {who} about {subject} on {date} at {time}.",
)

# (chat line, topics, concepts)
_CHATS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("User: I've been sleeping badly, let's not schedule anything before 8:30 this month.", ("health",), ("sleep", "schedule")),
    ("User: can you find a vegetarian recipe that Leo will actually eat?", ("food", "family"), ("vegetarian",)),
    ("User: Sam's been stressed with work, maybe plan something nice for the weekend.", ("family",), ()),
    ("User: don't let me sign up for another subscription, we're over budget this month.", ("finance",), ("budget",)),
    ("User: the boiler is making that noise again, I should message Olivia.", ("home",), ()),
    ("User: I want to read more fiction this year, suggest something short.", ("social",), ("books",)),
    ("User: remind me that Leo needs a costume for World Book Day.", ("family",), ("school",)),
    ("User: I'm thinking about asking Priya for a four-day week.", ("work",), ("schedule",)),
    ("User: Maya's cat is ill, I said I'd call her tonight.", ("family",), ()),
    ("User: my knee hurts after long runs, maybe I should see a physio.", ("health",), ("fitness",)),
    ("User: I keep forgetting to drink water, nudge me in the afternoons.", ("health",), ("reminders",)),
    ("User: let's cook at home four nights a week to save money.", ("food", "finance"), ("budget",)),
    ("User: mom mentioned she'd love to see a musical, keep that in mind for her birthday.", ("family",), ("birthdays", "gifts")),
    ("User: can you summarise the school newsletter? It's far too long.", ("family",), ("school",)),
    ("User: I want to pick up some Portuguese before the summer.", ("travel",), ("languages",)),
    ("User: Jonas is visiting London in August, we should host him.", ("social", "travel"), ()),
    ("User: I'd like to get back into climbing, maybe with Kwame.", ("health", "social"), ("fitness",)),
    ("User: the electricity bill doubled, check whether we're on the right tariff.", ("home", "finance"), ("bills", "budget")),
    ("User: Tomás recommended a Metabase course, add it to my learning list.", ("work",), ("learning",)),
    ("User: Sam wants to paint the living room green and I'm not convinced.", ("home", "family"), ()),
    ("User: book me a haircut sometime next week, just not Monday.", ("personal",), ("schedule",)),
    ("User: I need a present for Aisha, she's into ceramics.", ("social",), ("gifts",)),
    ("User: can we move Leo's swimming to Sundays? Saturdays are packed.", ("family",), ("swimming", "schedule")),
    ("User: I'm done with the open-plan office, I want to work from home on Tuesdays.", ("work",), ("schedule",)),
    ("User: I'd like to put £100 a month aside for the summer holiday.", ("finance", "travel"), ("budget", "savings")),
)


def _build_messages_everyday(w: _World) -> None:
    for p, topics, concepts in _PEOPLE:
        w.add("messages", w.rng.choice(_PEOPLE_TEMPLATES).format(p=p), "note", w.at(), topics, concepts, source="notes")
    for p, topics, concepts in _PREFERENCES:
        ctype = w.rng.choice(("note", "text"))
        w.add("messages", w.rng.choice(_PREFERENCE_TEMPLATES).format(p=p), ctype, w.at(), topics, concepts,
              source="notes")
    for plan, topics, concepts in _PLANS:
        when = w.at()
        text = plan.format(date=_wday(when + timedelta(days=w.rng.randint(4, 45))), friend=w.rng.choice(_FRIENDS))
        w.add("messages", text, "text", when, topics, concepts, source="assistant")
    for note, topics, concepts in _TRAVEL:
        when = w.at()
        slots = {"date": _wday(when + timedelta(days=w.rng.randint(10, 60))), "booking": w.booking()}
        text, idents = _fill(note, slots)
        key = w.add("messages", text, "note", when, topics, concepts, idents, "email")
        w.ident(slots["booking"], "messages", "booking", key)
    combos = [(p, s) for p in range(len(_MEETING_PEOPLE)) for s in range(len(_MEETING_SUBJECTS))]
    for pi, si in w.rng.sample(combos, 40):
        when = w.at()
        subject, concepts = _MEETING_SUBJECTS[si]
        who = _MEETING_PEOPLE[pi]
        text = w.rng.choice(_MEETING_TEMPLATES).format(
            who=who,
            Who=_cap(who),
            subject=subject,
            date=_wday(_workday(when, w.rng.randint(1, 14))),
            time=w.rng.choice(("09:30", "10:00", "11:30", "13:00", "14:30", "16:00")),
            place=w.rng.choice(_MEETING_PLACES),
        )
        ctype = w.rng.choice(("text", "note"))
        w.add("messages", text, ctype, when, ("work",), ("meetings", *concepts), source="calendar")
    for chat, topics, concepts in _CHATS:
        w.add("messages", chat, "chat", w.at(), topics, concepts, source="chat")
    for fact, topics, concepts in _HOUSEHOLD:
        w.add("messages", fact, "note", w.at(), topics, concepts, source="notes")


@dataclass(frozen=True)
class _SupportSpec:
    evidence: str
    evidence_type: str
    conclusion: str
    conclusion_type: str
    topics: tuple[str, ...]
    concepts: tuple[str, ...]
    question: str
    # The event's date range when the calendar matters (a summer camp is in summer).
    window: tuple[datetime, datetime] | None = None


_HOTELS = (
    ("Hotel Neri", "Barcelona"), ("The Balmoral", "Edinburgh"), ("Hotel Sanders", "Copenhagen"),
    ("The Grand Brighton", "Brighton"), ("Hotel Alfonso XIII", "Seville"),
)

_SUPPORTS: tuple[_SupportSpec, ...] = (
    _SupportSpec(
        "Booking confirmation: {hotel}, {city}, {date} for three nights, confirmation {booking}.", "note",
        "Trip to {city} is locked in from {date}: hotel booked, Sam is taking the Friday off.", "text",
        ("travel",), ("hotels",), "is the accommodation for the {city} trip sorted?",
    ),
    _SupportSpec(
        "Email from school: Year 4 parents' evening is on {date} at 17:30, slots via the parent portal.", "note",
        "Parents' evening for Leo on {date} at 17:30: slot booked with Ms Carter.", "text",
        ("family",), ("school",), "when am I meeting my son's teacher?",
    ),
    _SupportSpec(
        "Aisha: {date} works for me! I'll bring wine.", "chat",
        "Dinner with Aisha confirmed for {date}.", "text",
        ("social", "food"), (), "is the meal with Aisha actually happening?",
    ),
    _SupportSpec(
        "Receipt {booking}: £150 deposit for Leo's summer camp at Hampstead Heath, week starting {date}.", "note",
        "Leo's summer camp is paid and confirmed for the week of {date}.", "text",
        ("family", "finance"), ("school", "budget"), "did we pay for the kids' holiday club?",
        window=(datetime(2025, 7, 21, 9, tzinfo=_UTC), datetime(2025, 8, 25, 9, tzinfo=_UTC)),
    ),
    _SupportSpec(
        "Kentish Town Motors confirmed the service for {date} at 08:30, job number {booking}.", "note",
        "Car is booked in for its service on {date}; Sam will drop it off.", "text",
        ("home",), ("car",), "who is taking the vehicle to the garage, and when?",
    ),
    _SupportSpec(
        "Booking confirmation from {rest}: table for two on {date} at 20:00, reference {booking}.", "note",
        "Sam's birthday dinner at {rest} on {date} is booked.", "text",
        ("family", "food"), ("birthdays", "reservations"), "have I reserved somewhere for my partner's birthday meal?",
    ),
)


def _build_supports(w: _World) -> None:
    for spec in _SUPPORTS:
        if spec.window:
            event = w.at(*spec.window)
            event -= timedelta(days=event.weekday())  # camps start on a Monday
            t_ev = w.at(hi=event - timedelta(days=21))
        else:
            t_ev = w.at(hi=_END - timedelta(days=5))
            event = t_ev + timedelta(days=w.rng.randint(7, 40))
        hotel, city = w.rng.choice(_HOTELS)
        slots = {
            "date": _wday(event),
            "booking": w.booking(),
            "hotel": hotel,
            "city": city,
            "rest": w.rng.choice(("Noble Rot", "St. JOHN", "Lyle's", "Sabor", "The Palomar")),
        }
        ev_text, ev_idents = _fill(spec.evidence, slots)
        ev_key = w.add("messages", ev_text, spec.evidence_type, t_ev, spec.topics, spec.concepts, ev_idents,
                       "chat" if spec.evidence_type == "chat" else "email")
        c_text, c_idents = _fill(spec.conclusion, slots)
        t_c = t_ev + timedelta(hours=w.rng.randint(1, 48))
        c_key = w.add("messages", c_text, spec.conclusion_type, t_c, spec.topics, spec.concepts, c_idents,
                      "assistant", supported_by=[ev_key], grade=2)
        for ident in ev_idents:
            w.ident(ident, "messages", "booking", ev_key)
        w.optional_paraphrases.append(
            _QuerySpec(spec.question.format(**slots), "messages", "paraphrase", {c_key: 2, ev_key: 1})
        )


# (household fact, topics, concepts)
_HOUSEHOLD: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("The Wi-Fi router is the white box behind the TV; reboot it before calling the provider.", ("home",), ()),
    ("Bins go out on Tuesday night; recycling is every other week.", ("home",), ("schedule",)),
    ("The boiler was serviced in January; the next service is due in a year.", ("home",), ()),
    ("Spare keys: one with Ravi, one in the kitchen drawer.", ("home",), ()),
    ("Leo's school uniform comes from the shop on Holloway Road; he's size 9-10 now.", ("family",), ("school", "shopping")),
    ("Sam's ring size is M and shoe size EU 39.", ("family",), ("gifts", "shopping")),
    ("Netflix and Spotify are on the user's card; Disney+ is on Sam's.", ("finance",), ("subscriptions",)),
    ("The library books are due back at the end of the month.", ("family",), ("books",)),
    ("Tyre pressure for the car is 2.3 bar front and 2.1 rear.", ("home",), ("car",)),
    ("Leo's GP is Dr. Shah at the Caledonian Road practice.", ("health", "family"), ()),
    ("The recycling centre on Hornsey Street takes old electronics on Saturdays.", ("home",), ()),
    ("The plumber who fixed the leak last year was Dave from Islington Plumbing; Olivia has his number.", ("home",), ()),
)


# --------------------------------------------------------------------------- #
# queries
# --------------------------------------------------------------------------- #

_IDENT_QUESTIONS: dict[str, tuple[str, ...]] = {
    "error": ("{x}", "what caused {x}?", "{x} root cause", "why were we seeing {x}"),
    "ticket": ("{x}", "status of {x}", "what was {x} about?"),
    "host": ("what is on {x}", "{x}", "what do we know about {x}?"),
    "path": ("{x}", "review notes on {x}", "what did we say about {x}?"),
    "version": ("{x}", "what shipped in {x}?", "when did {x} go out?"),
    "bucket": ("{x}", "what is stored in {x}?"),
    "flight": ("{x}", "flight {x}"),
    "booking": ("{x}", "booking {x}", "what is reference {x} for?"),
}

# (question, namespace, required (field, value) pairs); judged from the tags the generator assigned.
_TOPICAL: tuple[tuple[str, str | None, tuple[tuple[str, str], ...]], ...] = (
    ("postgres problems and settings", "code", (("concepts", "postgres"),)),
    ("pods crashing or being killed in the cluster", "code", (("concepts", "kubernetes"), ("topics", "incidents"))),
    ("TLS certificate trouble", "code", (("concepts", "tls"),)),
    ("everything about our Kafka setup", "code", (("concepts", "kafka"),)),
    ("rate limiting", "code", (("concepts", "rate-limiting"),)),
    ("security review findings", "code", (("topics", "security"),)),
    ("food restrictions of people I cook for", "messages", (("concepts", "diet"),)),
    ("birthdays coming up", "messages", (("concepts", "birthdays"),)),
    ("doctor and dentist appointments", "messages", (("concepts", "appointments"),)),
    ("school stuff for Leo", "messages", (("concepts", "school"),)),
    ("money and budgets", None, (("concepts", "budget"),)),
)


def _topical_from_tags(w: _World) -> list[_QuerySpec]:
    out = []
    for text, namespace, required in _TOPICAL:
        judged = {
            d.key: d.grade
            for d in w.drafts
            if (namespace is None or d.namespace == namespace)
            and all(value in getattr(d, fld) for fld, value in required)
        }
        if judged:
            out.append(_QuerySpec(text, namespace, "topical", judged))
    return out


def _ident_queries(w: _World, n_extra: int) -> list[_QuerySpec]:
    """Every error code, plus ``n_extra`` other identifiers drawn at random."""
    holders: dict[str, list[int]] = {}
    for d in w.drafts:
        for ident in d.idents:
            holders.setdefault(ident, []).append(d.key)
    errors = [i for i in w.idents if i.kind == "error"]
    others = [i for i in w.idents if i.kind != "error"]
    chosen = errors + w.rng.sample(others, min(n_extra, len(others)))
    out = []
    seen: set[str] = set()
    for ident in chosen:
        if ident.value in seen:
            continue
        seen.add(ident.value)
        judged = {k: 1 for k in holders[ident.value]}
        judged[ident.primary] = 2
        text = w.rng.choice(_IDENT_QUESTIONS[ident.kind]).format(x=ident.value)
        # Identifiers are unique corpus-wide, so some queries leave the namespace open.
        namespace = None if w.rng.random() < 0.3 else ident.namespace
        out.append(_QuerySpec(text, namespace, "identifier", judged))
    return out


# --------------------------------------------------------------------------- #
# assembly
# --------------------------------------------------------------------------- #


@dataclass
class _Built:
    records: list[dict[str, Any]]
    queries: list[dict[str, Any]]
    qrels: dict[str, dict[str, int]]


def _build(seed: int) -> _Built:
    w = _World(random.Random(seed))
    for chain in _CHAINS:
        _build_chain(w, chain)
    for conflict in _CONFLICTS:
        _build_conflict(w, conflict)
    for incident in _INCIDENTS:
        _build_incident(w, incident)
    _build_supports(w)
    _build_code_everyday(w)
    _build_messages_everyday(w)

    # Ids follow creation time within a namespace, like an agent that appends.
    ids: dict[int, str] = {}
    for namespace, prefix in (("code", "code"), ("messages", "msg")):
        ordered = sorted((d for d in w.drafts if d.namespace == namespace), key=lambda d: (d.when, d.key))
        for n, d in enumerate(ordered, start=1):
            ids[d.key] = f"{prefix}-{n:04d}"
    records = [
        {
            "id": ids[d.key],
            "namespace": d.namespace,
            "content": d.content,
            "content_type": d.content_type,
            "created_at": _iso(d.when),
            "topics": d.topics,
            "concepts": d.concepts,
            "supersedes": sorted(ids[k] for k in d.supersedes),
            "conflicts": sorted(ids[k] for k in d.conflicts),
            "supported_by": sorted(ids[k] for k in d.supported_by),
            "metadata": d.metadata,
        }
        for d in sorted(w.drafts, key=lambda d: ids[d.key])
    ]

    specs = (
        _ident_queries(w, 13)
        + w.paraphrases
        + w.rng.sample(w.optional_paraphrases, 7)
        + w.topical
        + _topical_from_tags(w)
    )
    w.rng.shuffle(specs)
    queries: list[dict[str, Any]] = []
    qrels: dict[str, dict[str, int]] = {}
    for n, spec in enumerate(specs, start=1):
        qid = f"q{n:03d}"
        queries.append({"id": qid, "text": spec.text, "namespace": spec.namespace, "kind": spec.kind})
        qrels[qid] = {ids[k]: g for k, g in sorted(spec.judged.items(), key=lambda kv: ids[kv[0]])}
    return _Built(records, queries, qrels)


def generate_corpus(seed: int = 7) -> list[dict[str, Any]]:
    """The demo memories for ``seed``: ingest records sorted by id.

    Same seed, same records (byte for byte once serialised). Ids are
    ``code-NNNN`` / ``msg-NNNN`` in creation order; every edge points to a
    record in the list; chain members are strictly newer than what they
    supersede; all timestamps lie in 2025-01-01..2025-09-30 UTC.
    """
    return _build(seed).records


def generate_queries(
    corpus: list[dict[str, Any]], seed: int = 7
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """Queries and graded judgments (1 relevant, 2 best answer) for the corpus of ``seed``.

    Judgments come from what the generator planted, not from searching. The
    corpus must be ``generate_corpus(seed)`` (judged ids are checked against it);
    a mismatch raises ``ValueError`` rather than returning judgments that
    silently point at the wrong memories.
    """
    built = _build(seed)
    given = {r.get("id"): r.get("content") for r in corpus}
    expected = {r["id"]: r["content"] for r in built.records}
    for judged in built.qrels.values():
        for memory_id in judged:
            if given.get(memory_id) != expected[memory_id]:
                raise ValueError(f"corpus does not match seed {seed}: memory {memory_id!r} differs or is missing")
    return built.queries, built.qrels


def _jsonl(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_demo(directory: Path, seed: int = 7) -> dict[str, Path]:
    """Write ``memories.jsonl``, ``queries.jsonl`` and ``qrels.tsv`` into ``directory``.

    Creates the directory. ``qrels.tsv`` is header-free TREC qrels:
    ``query_id<TAB>0<TAB>doc_id<TAB>grade``. Output is deterministic for a seed.
    Returns the three paths keyed ``memories``, ``queries``, ``qrels``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    built = _build(seed)
    paths = {
        "memories": directory / "memories.jsonl",
        "queries": directory / "queries.jsonl",
        "qrels": directory / "qrels.tsv",
    }
    paths["memories"].write_text(_jsonl(built.records), encoding="utf-8")
    paths["queries"].write_text(_jsonl(built.queries), encoding="utf-8")
    paths["qrels"].write_text(
        "".join(f"{qid}\t0\t{doc}\t{grade}\n" for qid, judged in built.qrels.items() for doc, grade in judged.items()),
        encoding="utf-8",
    )
    return paths
