"""Fuzzing the public surface: ``search``, ``search_async``, ``search_many``,
ingest records and the CLI's arguments (issue 8).

The tests of this concern for the in-process canvas (the embedded tier); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_fuzz.py``.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.unit.test_fuzz import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    _PROPERTY,
    _many,
    _one_search,
    batch_sizes,
    cli_env,
    fuzz_store,
    fz,
    ingest_store,
    many_items,
    options,
    queries,
)


# -- search / search_async -------------------------------------------------------------
@hsettings(max_examples=100, **_PROPERTY)
@given(text=queries, opts=options(), use_async=st.booleans())
def test_fuzz_search(fz, text, opts, use_async):
    _one_search(text, opts, use_async)


@hsettings(max_examples=30, **_PROPERTY)
@given(items=many_items, batch_size=batch_sizes, return_exceptions=st.booleans())
def test_fuzz_search_many(fz, items, batch_size, return_exceptions):
    _many(items, batch_size, return_exceptions)
