"""Scoping: no result and no graph link outside the query's scope, ever.

The tests of this concern for the slow tier (CI runs it; the default tier does not); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_scope.py``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.unit.test_scope import _PROPERTY, _check_store, _check_store_batched, queries, stores  # noqa: F401  (helpers and fixtures shared with the unit tests)


@pytest.mark.slow
@hsettings(max_examples=100, **_PROPERTY)
@given(records=stores(max_size=25), qs=st.lists(queries, min_size=3, max_size=8))
def test_no_result_or_link_outside_the_scope_many(embedded, records, qs):
    _check_store(records, qs)


@pytest.mark.slow
@hsettings(max_examples=50, deadline=None,
           suppress_health_check=[*_PROPERTY["suppress_health_check"], HealthCheck.large_base_example])
@given(records=stores(max_size=25), qs=st.lists(queries, min_size=200, max_size=200))
def test_no_result_or_link_outside_the_scope_10k_queries(embedded, records, qs):
    """50 random stores x 200 scoped queries = 10,000 queries (the figure is in the summary)."""
    _check_store_batched(records, qs)
