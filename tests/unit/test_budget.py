"""Budgets: maxUnits, maxChars, maxMs applied in rank order."""

from __future__ import annotations

from datetime import datetime

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipeline.contracts import Batch, Budget, LegRun, Query, QueryState, Result, Truncation
from pipeline.stages.budget import apply_budget, budget_batch


def _result(rank: int, content: str, mid: str | None = None) -> Result:
    return Result(
        rank=rank, id=mid or f"m{rank}", score=1.0 / rank, rrf=1.0 / rank,
        namespace="ns", content_type="text", created_at=datetime(2025, 1, 1),
        content=content, preview=content[:20],
    )


def _state(lengths, *, max_units=None, max_chars=None, max_ms=None, legs=None) -> QueryState:
    q = Query(id="q", text="t", budget=Budget(max_units=max_units, max_chars=max_chars, max_ms=max_ms))
    results = [_result(i, "x" * n) for i, n in enumerate(lengths, start=1)]
    return QueryState(query=q, results=results, legs=legs or {})


def _ids(state):
    return [r.id for r in state.results]


# -- maxUnits ---------------------------------------------------------------------
def test_max_units_keeps_the_first_n():
    state = apply_budget(_state([5] * 5, max_units=3))
    assert _ids(state) == ["m1", "m2", "m3"]
    assert state.truncated is True
    assert state.truncation == Truncation(by="maxUnits", left_out=2, limit=3)


def test_max_units_equal_to_the_count_is_not_a_truncation():
    state = apply_budget(_state([5] * 3, max_units=3))
    assert _ids(state) == ["m1", "m2", "m3"]
    assert state.truncated is False and state.truncation is None


# -- maxChars ---------------------------------------------------------------------
def test_result_that_does_not_fit_ends_the_list():
    # 10 + 10 = 20 <= 25; + 30 = 50 > 25 -> stop at the 3rd. The 4th (5 chars)
    # would fit into the 5 left, but a lower result never jumps ahead.
    state = apply_budget(_state([10, 10, 30, 5], max_chars=25))
    assert _ids(state) == ["m1", "m2"]
    assert state.truncated is True
    assert state.truncation == Truncation(by="maxChars", left_out=2, limit=25)


def test_exact_fit_is_kept():
    state = apply_budget(_state([10, 15], max_chars=25))  # 25 <= 25
    assert _ids(state) == ["m1", "m2"]
    assert not state.truncated and state.truncation is None


def test_first_result_too_long_leaves_nothing():
    state = apply_budget(_state([30, 1, 1], max_chars=25))
    assert state.results == []
    assert state.truncation == Truncation(by="maxChars", left_out=3, limit=25)


def test_characters_not_bytes_are_counted():
    # 10 "é" are 10 characters (20 bytes in UTF-8): two of them make 20 <= 20.
    q = Query(id="q", text="t", budget=Budget(max_chars=20))
    state = QueryState(query=q, results=[_result(1, "é" * 10), _result(2, "é" * 10)])
    apply_budget(state)
    assert len(state.results) == 2 and not state.truncated


def test_no_truncation_when_everything_fits():
    state = apply_budget(_state([3, 4, 5], max_units=10, max_chars=100, max_ms=1000))
    assert _ids(state) == ["m1", "m2", "m3"]
    assert state.truncated is False
    assert state.truncation is None


def test_no_budget_at_all_keeps_everything():
    state = apply_budget(_state([1000] * 50))
    assert len(state.results) == 50 and not state.truncated


def test_chars_cut_after_units_cut_reports_chars_and_counts_everything_left_out():
    # 5 results, maxUnits 3 keeps m1..m3; of those 10 + 10 + 10 = 30 > 25 stops at m3:
    # 2 kept, 3 of the 5 left out, and the budget that cut last is maxChars.
    state = apply_budget(_state([10] * 5, max_units=3, max_chars=25))
    assert _ids(state) == ["m1", "m2"]
    assert state.truncation == Truncation(by="maxChars", left_out=3, limit=25)


def test_ranks_are_not_reordered():
    q = Query(id="q", text="t", budget=Budget(max_chars=12))
    # deliberately listed with ids out of order: the budget follows list order
    results = [_result(1, "x" * 6, "zz"), _result(2, "x" * 6, "aa"), _result(3, "x", "bb")]
    state = apply_budget(QueryState(query=q, results=results))
    assert _ids(state) == ["zz", "aa"]


# -- maxMs -------------------------------------------------------------------------
def test_timed_out_leg_truncates_by_max_ms():
    legs = {
        "vector": LegRun(leg="vector", ran=False, profile={"timed_out": True}),
        "fts": LegRun(leg="fts", ran=True, profile={"timed_out": False}),
    }
    state = apply_budget(_state([5, 5], max_ms=50, legs=legs))
    assert _ids(state) == ["m1", "m2"]  # what did arrive is kept
    assert state.truncated is True
    t = state.truncation
    assert (t.by, t.left_out, t.limit) == ("maxMs", 0, 50)
    assert "vector" in t.detail and "fts" not in t.detail


def test_max_ms_with_a_units_cut_counts_the_units_left_out():
    legs = {"fts": LegRun(leg="fts", ran=False, profile={"timed_out": True})}
    state = apply_budget(_state([5] * 4, max_units=1, max_ms=50, legs=legs))
    assert _ids(state) == ["m1"]
    assert (state.truncation.by, state.truncation.left_out) == ("maxMs", 3)


def test_legs_in_time_are_no_truncation():
    legs = {"fts": LegRun(leg="fts", ran=True, profile={"timed_out": False}), "vector": LegRun(leg="vector", ran=True)}
    state = apply_budget(_state([5, 5], max_ms=50, legs=legs))
    assert not state.truncated and state.truncation is None


def test_budget_batch_applies_to_every_state_and_times_it():
    batch = Batch(states=[_state([1, 1, 1], max_units=1), _state([1, 1, 1], max_units=5)])
    out = budget_batch(batch)
    assert [len(s.results) for s in out.states] == [1, 3]
    assert [s.truncated for s in out.states] == [True, False]
    assert all("budget" in s.timings for s in out.states)


# -- property ----------------------------------------------------------------------
@hsettings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), max_size=15),
    max_units=st.none() | st.integers(1, 20),
    max_chars=st.none() | st.integers(1, 200),
)
def test_budget_keeps_the_longest_prefix_that_fits(lengths, max_units, max_chars):
    state = apply_budget(_state(lengths, max_units=max_units, max_chars=max_chars))
    kept = len(state.results)
    # a prefix of the ranked list
    assert _ids(state) == [f"m{i}" for i in range(1, kept + 1)]
    # within both budgets
    if max_units is not None:
        assert kept <= max_units
    if max_chars is not None:
        assert sum(lengths[:kept]) <= max_chars
    # and the longest such prefix: one more would break a budget
    if kept < len(lengths):
        over_units = max_units is not None and kept + 1 > max_units
        over_chars = max_chars is not None and sum(lengths[: kept + 1]) > max_chars
        assert over_units or over_chars
    assert state.truncated == (kept < len(lengths))
    if state.truncated:
        assert state.truncation.left_out == len(lengths) - kept
    else:
        assert state.truncation is None


def test_text_output_says_why_a_deadline_cut_the_list():
    """``format_results`` shows the truncation's detail (the legs the deadline
    stopped), not only ``--json``."""
    from pipeline.contracts import Mode, Results, Truncation
    from workers.cli.render import format_results

    cut = Truncation(by="maxMs", left_out=0, limit=1, detail="deadline reached before leg(s) finished: fts, vector")
    res = Results(query_id="q", query="billing", mode="none", requested_mode=Mode.hybrid, results=[],
                  truncated=True, truncation=cut, total_ms=484.0)
    assert format_results(res).splitlines() == [
        "no results for 'billing' (none)",
        "mode none, 484 ms, truncated by maxMs (limit 1, 0 left out): deadline reached before leg(s) finished: fts, vector",
    ]
