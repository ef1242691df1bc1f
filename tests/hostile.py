"""Hostile input for the hardening tests: SQL and full-text syntax, control and
bidirectional characters, lone surrogates, very long Unicode, wrong types.

Agents write memories from web pages and users; any of these may arrive as a
namespace, a topic key, a concept, a content type, an id or a query.
"""

from __future__ import annotations

from datetime import UTC, timedelta, timezone

from hypothesis import strategies as st

# Strings with meaning in SQL, DuckDB, the FTS macro, LIKE, JSON or the terminal.
EVIL = [
    "x' OR '1'='1",
    "'; DROP TABLE memories; --",
    "' UNION SELECT id, content FROM memories --",
    '" OR ""="',
    "x\\' OR 1=1 --",
    "%",
    "%%",
    "_",
    "a%b_c",
    "*",
    "deploy*",
    "OR",
    "deploy OR window",
    "NOT deploy",
    "NEAR(deploy window)",
    "\"deploy window\"",
    "-- comment",
    "/* c */",
    ";",
    "$q",
    "?",
    ":ns",
    "${ns}",
    "{{ns}}",
    "__root__",
    "ns:a",
    "fts_main_memories",
    "memories",
    "match_bm25(id, 'x')",
    "[1, 2]",
    '{"a": 1}',
    "null",
    "NULL",
    "\u202egnp.exe",  # right-to-left override
    "\u200f\u200edeploy",  # right-to-left and left-to-right marks
    "\ufeffbom",
    "e\u0301",  # combining accent
    "Ω≈ç√∫",
    "🙂🚀",
    "\t\n\r",
    "é" * 600,
]

# The same, with characters dimple refuses (a typed error is the right answer).
REFUSED = ["a\x00b", "\x00", "x' OR '1'='1\x00", "\ud800", "ok\udfffok"]

_OFFSETS = [None, UTC, timezone(timedelta(hours=5)), timezone(timedelta(hours=-11, minutes=-30))]

short_text = st.text(max_size=24)
any_char_text = st.text(st.characters(exclude_categories=()), max_size=24)  # lone surrogates included
evil = st.sampled_from(EVIL)
refused = st.sampled_from(REFUSED)


def long_text(max_len: int = 11_000):
    """A hostile piece repeated to a length around dimple's limits."""
    return st.tuples(st.sampled_from(EVIL + ["é", "🙂", "\u202e", "deploy "]), st.integers(1, max_len)).map(
        lambda t: (t[0] * t[1])[: t[1]]
    )


def strings(*, known: list[str] = ()):
    """Any string a caller could send: hostile, random, long, or one the store knows."""
    parts = [evil, short_text, any_char_text, refused, long_text(700)]
    if known:
        parts.insert(0, st.sampled_from(list(known)))
    return st.one_of(*parts)


def junk():
    """Values of the wrong type."""
    return st.one_of(st.none(), st.integers(-(2**70), 2**70), st.floats(), st.booleans(),
                     st.lists(st.integers(), max_size=2), st.binary(max_size=4), st.dictionaries(short_text, st.integers(), max_size=1))


def labels(known: list[str]):
    """A filter option: a list of labels (usually), one label, or junk."""
    label = strings(known=known)
    return st.one_of(st.lists(label, max_size=4), label, st.lists(st.one_of(label, junk()), max_size=2), junk())


def datetimes():
    return st.one_of(
        st.datetimes(timezones=st.sampled_from(_OFFSETS)),
        st.datetimes(timezones=st.sampled_from(_OFFSETS)).map(lambda d: d.isoformat()),
        strings(),
    )


def numbers(low: int, high: int):
    """Mostly in a sensible range, sometimes far outside it or of the wrong type."""
    return st.one_of(st.integers(low, high), st.integers(-(2**40), 2**62), st.floats(), junk(), strings())
