"""Fuzzing the public surface: ``search``, ``search_async``, ``search_many``,
ingest records and the CLI's arguments (issue 8).

The tests of this concern for the slow tier (CI runs it; the default tier does not); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_fuzz.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.unit.test_fuzz import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    _PROPERTY,
    _cli_case,
    _ingest_case,
    _many,
    _one_search,
    argvs,
    batch_sizes,
    cli_env,
    fuzz_store,
    fz,
    ingest_files,
    ingest_store,
    many_items,
    options,
    queries,
)


@pytest.mark.slow
@hsettings(max_examples=2_500, **_PROPERTY)
@given(text=queries, opts=options(), use_async=st.booleans())
def test_fuzz_search_many_cases(fz, text, opts, use_async):
    _one_search(text, opts, use_async)


@pytest.mark.slow
@hsettings(max_examples=400, **_PROPERTY)
@given(items=many_items, batch_size=batch_sizes, return_exceptions=st.booleans())
def test_fuzz_search_many_many_cases(fz, items, batch_size, return_exceptions):
    _many(items, batch_size, return_exceptions)


@pytest.mark.slow
@hsettings(max_examples=100, **_PROPERTY)
@given(lines=ingest_files, skip_invalid=st.booleans())
def test_fuzz_ingest_many_cases(ingest_store, tmp_path, lines, skip_invalid):
    _ingest_case(ingest_store, tmp_path, lines, skip_invalid)


@pytest.mark.slow
@hsettings(max_examples=2_000, **_PROPERTY)
@given(argv=argvs)
def test_fuzz_cli_many_cases(cli_env, capsys, argv):
    _cli_case(argv, capsys)
