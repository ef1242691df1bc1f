"""A kept graph against a fresh read on more random stores than the default
tier draws (``tests/unit/test_base_graph.py`` holds the check)."""

from __future__ import annotations

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.unit.test_base_graph import cases, check_kept_graph
from tests.unit.test_scope import stores


@hsettings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=stores(max_size=10), drawn=cases, rewrite=st.data())
def test_a_kept_graph_gives_the_answer_of_a_fresh_read_across_deltas_many(records, drawn, rewrite):
    check_kept_graph(records, drawn, rewrite)
