"""Scoping: no result and no graph link outside the query's scope, ever.

The tests of this concern for the in-process canvas (the embedded tier); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_scope.py``.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tests.unit.test_scope import _PROPERTY, HAND_PICKED, _check_store, _check_store_batched, _ingest, queries, stores  # noqa: F401  (helpers and fixtures shared with the unit tests)


def test_scoped_search_through_the_pipeline_hand_picked(embedded, tmp_path):
    from workers import api, resources

    settings, membership = _ingest(tmp_path / "hand", HAND_PICKED)
    resources.current().configure(settings)
    # Unscoped, m0 carries its links: superseded by m1 and m2, in conflict with m2 and m3.
    out = api.search("deploy window tuesday", max_units=100)
    m0 = next(r for r in out.results if r.id == "m0")
    assert [l.id for l in m0.superseded_by] == ["m1", "m2"]
    assert [l.id for l in m0.conflicts] == ["m2", "m3"]
    # Scoped to namespace a, type code, topic t1: m0 is the only memory inside, and every
    # link is outside (m1 is text, m2 is in namespace b, m3 has topic t2).
    out = api.search("deploy window", namespace="a", topics=["t1"], content_type="code", max_units=100)
    assert [r.id for r in out.results] == ["m0"]
    assert out.results[0].superseded_by == [] and out.results[0].conflicts == []
    # Topic scope by the namespace's tree node: everything in a, nothing from b.
    out = api.search("deploy window", topics=["ns:a"], max_units=100)
    assert sorted(r.id for r in out.results) == ["m0", "m1", "m3"]
    # Topic scope by a tree leaf: only the memories the tree put in that leaf.
    leaf_of_m2 = next(k for k in membership["m2"] if not k.startswith("ns:"))
    out = api.search("deploy window", topics=[leaf_of_m2], max_units=100)
    assert [r.id for r in out.results] == ["m2"]
    resources.current().configure(embedded)


@hsettings(max_examples=4, **_PROPERTY)  # the slow tier draws 150 more (tests/slow/test_scope_slow.py)
@given(records=stores(), qs=st.lists(queries, min_size=1, max_size=3))
def test_no_result_or_link_outside_the_scope(embedded, records, qs):
    _check_store(records, qs)


@hsettings(max_examples=4, **_PROPERTY)
@given(records=stores(), qs=st.lists(queries, min_size=10, max_size=15))
def test_audit_rows_record_the_scope(embedded, records, qs):
    _check_store_batched(records, qs, audit=True)
