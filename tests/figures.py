"""Counters that the hardening tests (fuzzing, injection, scope isolation)
report at the end of a pytest run, so the figures in SECURITY.md come from
test output rather than from a claim.

``with case("api.search"):`` counts one generated case; any exception the
body lets out (a crash or a failed assertion) counts as a failure and is
re-raised, so the test fails. ``refused(name)`` counts a case that ended in
the typed error bad input should get. ``tests/conftest.py`` prints one line
per counter at the end of the run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Tally:
    tried: int = 0
    refused: int = 0  # cases that ended in a typed error (bad input, as it should)
    failures: int = 0  # anything else: a crash, a broken promise
    extra: int = 0  # what the counter says it counts besides (results checked, queries...)
    extra_name: str = ""


TALLIES: dict[str, Tally] = defaultdict(Tally)


@contextmanager
def case(name: str) -> Iterator[Tally]:
    tally = TALLIES[name]
    tally.tried += 1
    try:
        yield tally
    except BaseException:
        tally.failures += 1
        raise


def refused(name: str) -> None:
    """The case ended in the typed error it should (InputError, IngestValidationError, exit code 2)."""
    TALLIES[name].refused += 1


def count(name: str, what: str, n: int = 1) -> None:
    """Add ``n`` to a counter's second figure (e.g. results checked)."""
    tally = TALLIES[name]
    tally.extra += n
    tally.extra_name = what


def lines() -> list[str]:
    out = []
    for name in sorted(TALLIES):
        t = TALLIES[name]
        extra = f", {t.extra} {t.extra_name}" if t.extra_name else ""
        out.append(f"{name}: {t.tried} cases, {t.refused} refused with a typed error, {t.failures} failures{extra}")
    return out


def dump() -> dict[str, dict]:
    """The counters as JSON-safe dicts (an xdist worker sends them to the controller)."""
    return {name: vars(t) for name, t in TALLIES.items()}


def merge(counters: dict[str, dict]) -> None:
    """Add a worker's counters (``dump()``) to this process's."""
    for name, fields in counters.items():
        tally = TALLIES[name]
        tally.tried += fields["tried"]
        tally.refused += fields["refused"]
        tally.failures += fields["failures"]
        tally.extra += fields["extra"]
        tally.extra_name = fields["extra_name"] or tally.extra_name
