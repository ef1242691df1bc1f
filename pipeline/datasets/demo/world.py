"""The generator's state while it builds one corpus, and the small pure helpers it uses.

Everything random is drawn from ``World.rng``; the order of the draws is part of
the output (the same seed gives the same bytes), so changes here change the corpus.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

START = datetime(2025, 1, 1, 7, 0, tzinfo=UTC)
END = datetime(2025, 9, 30, 21, 0, tzinfo=UTC)

_MONTHS = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

# Slot names whose values are exact identifiers; every memory records the ones
# it contains so identifier queries can be judged without searching.
IDENT_SLOTS = frozenset(
    {"code", "host", "node", "aux", "ticket", "version", "path", "path2", "booking", "flight", "bucket"}
)


# --------------------------------------------------------------------------- #
# small pure helpers
# --------------------------------------------------------------------------- #


def iso(dt: datetime) -> str:
    """ISO-8601 UTC with a ``Z`` suffix, second precision."""
    return f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}Z"


def day(dt: datetime) -> str:
    """'12 June' (locale independent, unlike strftime %B)."""
    return f"{dt.day} {_MONTHS[dt.month - 1]}"


def wday(dt: datetime) -> str:
    """'Thursday 12 June'."""
    return f"{_WEEKDAYS[dt.weekday()]} {dt.day} {_MONTHS[dt.month - 1]}"


def workday(dt: datetime, days: int) -> datetime:
    """``days`` after ``dt``, pushed past a weekend onto the next Monday."""
    out = dt + timedelta(days=days)
    return out + timedelta(days=(7 - out.weekday()) % 7) if out.weekday() >= 5 else out


def slot_names(template: str) -> list[str]:
    """The ``{slot}`` names a format template uses, in order (escaped braces are not slots)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def fill(
    template: str, slots: Mapping[str, str], ident_slots: Iterable[str] = IDENT_SLOTS
) -> tuple[str, list[str]]:
    """Format ``template``; also return the identifier values it actually used."""
    wanted = set(ident_slots)
    idents: list[str] = []
    for name in slot_names(template):
        if name in wanted and slots[name] not in idents:
            idents.append(slots[name])
    return template.format(**slots), idents


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# --------------------------------------------------------------------------- #
# the generator's state while it builds one corpus
# --------------------------------------------------------------------------- #


@dataclass
class Draft:
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
class Ident:
    value: str
    namespace: str
    kind: str
    primary: int  # draft key judged 2; the other drafts containing it get 1


@dataclass
class QuerySpec:
    text: str
    namespace: str | None
    kind: str
    judged: dict[int, int]


@dataclass
class World:
    rng: random.Random
    drafts: list[Draft] = field(default_factory=list)
    idents: list[Ident] = field(default_factory=list)
    paraphrases: list[QuerySpec] = field(default_factory=list)  # always asked
    optional_paraphrases: list[QuerySpec] = field(default_factory=list)  # sampled
    topical: list[QuerySpec] = field(default_factory=list)
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

    def at(self, lo: datetime = START, hi: datetime = END) -> datetime:
        """A random instant in [lo, hi], in waking hours (07:00-21:00) so chat memories read plausibly."""
        first = datetime(lo.year, lo.month, lo.day, tzinfo=UTC)
        days = (hi - first).days
        for _ in range(100):
            t = first + timedelta(days=self.rng.randint(0, days), minutes=self.rng.randrange(7 * 60, 21 * 60))
            if lo <= t <= hi:
                return t
        return lo

    def times(self, k: int, gap_days: int) -> list[datetime]:
        """k strictly increasing instants in the corpus period, on days at least ``gap_days`` apart."""
        first = datetime(START.year, START.month, START.day, tzinfo=UTC)
        free = (END - first).days - gap_days * (k - 1)
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
            Draft(
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
        self.idents.append(Ident(value, namespace, kind, primary))
