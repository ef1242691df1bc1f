"""Recency boost: ``final = rrf * (1 + boost * 1/(1 + ageDays))``, stable re-rank."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipeline.contracts import Batch, Fused, Hit, LegRun, Query, QueryOptions, QueryState
from pipeline.stages.fuse import fuse_batch
from pipeline.stages.fuse.recency import apply_recency, recency_factor

NOW = datetime(2025, 6, 1, 12, 0, 0)


def _fused(*items):
    return [Fused(id=i, rrf=r, score=r) for i, r in items]


# -- recency_factor ----------------------------------------------------------------
@pytest.mark.parametrize(
    "age,expected",
    [
        (timedelta(0), 1.0),  # 1/(1+0)
        (timedelta(days=1), 0.5),  # 1/(1+1)
        (timedelta(days=3), 0.25),  # 1/(1+3)
        (timedelta(hours=12), 1 / 1.5),  # half a day: 1/(1+0.5)
        (timedelta(days=-2), 1.0),  # from the future: age 0
        (timedelta(seconds=-1), 1.0),
    ],
)
def test_recency_factor_on_fixed_dates(age, expected):
    assert recency_factor(NOW - age, NOW) == pytest.approx(expected, rel=1e-12)


@hsettings(max_examples=100, deadline=None)
@given(a=st.integers(0, 10**8), b=st.integers(0, 10**8))
def test_older_never_scores_higher(a, b):
    # seconds of age: the factor is in (0, 1] and does not increase with age
    fa = recency_factor(NOW - timedelta(seconds=a), NOW)
    fb = recency_factor(NOW - timedelta(seconds=b), NOW)
    assert 0 < fa <= 1 and 0 < fb <= 1
    if a <= b:
        assert fa >= fb


# -- apply_recency -----------------------------------------------------------------
def test_boost_multiplies_rrf_by_one_plus_boost_times_factor():
    fused = _fused(("a", 1 / 61), ("b", 1 / 62), ("c", 1 / 63))
    created = {"a": NOW - timedelta(days=3), "b": NOW, "c": NOW - timedelta(days=1)}
    out = apply_recency(fused, created, 2.0, NOW)
    by_id = {f.id: f for f in out}
    # a: factor 1/4 -> (1/61)*(1+2/4) = 0.02459
    # b: factor 1   -> (1/62)*(1+2)   = 0.04839
    # c: factor 1/2 -> (1/63)*(1+1)   = 0.03175
    assert by_id["a"].score == pytest.approx((1 / 61) * 1.5, rel=1e-12)
    assert by_id["b"].score == pytest.approx((1 / 62) * 3.0, rel=1e-12)
    assert by_id["c"].score == pytest.approx((1 / 63) * 2.0, rel=1e-12)
    assert [by_id[i].recency_factor for i in "abc"] == [pytest.approx(0.25), 1.0, pytest.approx(0.5)]
    assert [f.rrf for f in out] == [1 / 62, 1 / 63, 1 / 61]  # rrf kept as it was
    assert [f.id for f in out] == ["b", "c", "a"]


def test_equal_final_scores_keep_the_fused_order():
    # Powers of two keep the arithmetic exact:
    #   y: rrf 0.375, 1 day old (factor 1/2), boost 2 -> 0.375 * 2 = 0.75
    #   x: rrf 0.25,  brand new (factor 1),   boost 2 -> 0.25  * 3 = 0.75
    # y was fused first, so it stays first although "x" < "y".
    fused = _fused(("y", 0.375), ("x", 0.25))
    created = {"y": NOW - timedelta(days=1), "x": NOW}
    out = apply_recency(fused, created, 2.0, NOW)
    assert [f.score for f in out] == [0.75, 0.75]
    assert [f.id for f in out] == ["y", "x"]


def test_stable_for_many_equal_scores():
    order = ["m5", "m1", "m9", "m3", "m7"]
    fused = _fused(*[(i, 0.5) for i in order])
    out = apply_recency(fused, {i: NOW - timedelta(days=1) for i in order}, 1.0, NOW)
    assert [f.id for f in out] == order


def test_boost_zero_leaves_order_and_scores_unchanged():
    fused = _fused(("a", 1 / 61), ("b", 1 / 62), ("c", 1 / 63))
    created = {"a": NOW - timedelta(days=300), "b": NOW - timedelta(days=9), "c": NOW}
    out = apply_recency(fused, created, 0.0, NOW)
    assert [f.id for f in out] == ["a", "b", "c"]
    assert [f.score for f in out] == [1 / 61, 1 / 62, 1 / 63]
    assert all(f.recency_factor is None for f in out)


# -- through fuse_batch ------------------------------------------------------------
def _batch(boost: float, now) -> Batch:
    q = Query(id="q", text="t", weights={"vector": 0.0, "fts": 1.0},
              options=QueryOptions(recency_boost=boost, now=now))
    legs = {"fts": LegRun(leg="fts", ran=True, hits=[Hit(id=m, score=1.0, rank=r) for r, m in enumerate(["old", "new"], 1)])}
    return Batch(states=[QueryState(query=q, legs=legs)])


def test_fuse_batch_boosts_with_the_querys_now():
    created = {"old": datetime(2025, 1, 1), "new": datetime(2025, 1, 11)}
    out = fuse_batch([_batch(1.0, datetime(2025, 1, 11))], 60, lambda ids: {i: created[i] for i in ids})
    fused = out.states[0].fused
    # old: rrf 1/61, 10 days -> 1/61 * (1 + 1/11) = 0.01788
    # new: rrf 1/62,  0 days -> 1/62 * 2          = 0.03226 -> new moves ahead
    assert [f.id for f in fused] == ["new", "old"]
    assert fused[1].score == pytest.approx((1 / 61) * (1 + 1 / 11), rel=1e-12)
    assert fused[0].score == pytest.approx((1 / 62) * 2, rel=1e-12)
    assert "recency" in out.states[0].timings


def test_fuse_batch_timezone_aware_now_is_taken_as_utc():
    # now = 2025-01-02T00:00+02:00 = 2025-01-01T22:00Z; created 2025-01-01T00:00Z
    # -> age 22 hours -> factor 1/(1 + 22/24)
    now = datetime.fromisoformat("2025-01-02T00:00:00+02:00")
    created = {"old": datetime(2025, 1, 1), "new": datetime(2025, 1, 1)}
    out = fuse_batch([_batch(1.0, now)], 60, lambda ids: {i: created[i] for i in ids})
    assert out.states[0].fused[0].recency_factor == pytest.approx(1 / (1 + 22 / 24), rel=1e-12)


def test_fuse_batch_without_boost_does_not_look_up_dates():
    def boom(ids):
        raise AssertionError("created_at looked up with boost 0")

    out = fuse_batch([_batch(0.0, None)], 60, boom)
    fused = out.states[0].fused
    assert [f.id for f in fused] == ["old", "new"]
    assert [f.score for f in fused] == [1 / 61, 1 / 62]
    assert "recency" not in out.states[0].timings


def test_a_hit_fusions_snapshot_does_not_hold_is_fused_without_a_boost():
    """Each stage reads its own process's snapshot: a leg may return a memory
    written (or forgotten) since the one fusion reads, whose ``created_at``
    fusion cannot look up. The query goes on; that memory gets no boost."""
    created = {"old": datetime(2025, 1, 1)}  # "new" is not live in fusion's view
    out = fuse_batch([_batch(1.0, datetime(2025, 1, 11))], 60, lambda ids: {i: created[i] for i in ids if i in created})
    fused = {f.id: f for f in out.states[0].fused}
    assert fused["new"].recency_factor == 0.0 and fused["new"].score == 1 / 62
    assert fused["old"].score == pytest.approx((1 / 61) * (1 + 1 / 11), rel=1e-12)
