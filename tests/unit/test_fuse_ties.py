"""The full-text leg's near-equal scores under RRF (``fts_tie_tolerance``):
hits whose BM25 lies within the tolerance of their group's first count at the
group's average rank, so the vector leg orders what the lexical leg cannot
tell apart (BENCHMARKS.md, "Fusion defaults, third round")."""

from __future__ import annotations

import pytest

from pipeline.audit.explain import explain
from pipeline.audit.record import build_record
from pipeline.contracts import Hit, LegRun, QueryState, make_query
from pipeline.settings import Settings
from pipeline.stages.fuse import LegWeighting, fuse_state, rrf, tie_ranks

SETTINGS = Settings(_env_file=None)


def test_a_group_within_the_tolerance_of_its_first_shares_the_average_position():
    assert tie_ranks([10.0, 9.5, 9.1, 8.0, 7.9, 3.0], 0.1) == [2, 2, 2, 4.5, 4.5, 6]
    assert tie_ranks([4.0, 4.0, 1.0], 0.1) == [1.5, 1.5, 3]
    assert tie_ranks([], 0.1) == []


def test_groups_are_measured_from_their_first_not_chained_down_the_list():
    # 8.5 is within 10% of 9.2 but not of 10: a new group starts there
    assert tie_ranks([10.0, 9.2, 8.5, 7.8], 0.1) == [1.5, 1.5, 3.5, 3.5]
    # a slow slide of 5% steps never forms one long group
    slide = [100 * 0.95 ** i for i in range(8)]
    assert tie_ranks(slide, 0.1) == [2, 2, 2, 5, 5, 5, 7.5, 7.5]


def test_tolerance_zero_keeps_every_position_even_exact_ties():
    assert tie_ranks([3.0, 3.0, 2.0], 0.0) == [1, 2, 3]


def test_the_other_leg_orders_what_the_lexical_leg_cannot_tell_apart():
    # one person's three memories all match only the name: BM25 within 4% of each other
    legs = {"fts": ["a", "b", "c"], "vector": ["c", "a", "b"]}
    w = {"vector": 1.0, "fts": 1.0}
    plain = rrf(legs, w, 60)
    tied = rrf(legs, w, 60, {"fts": tie_ranks([5.0, 4.9, 4.8], 0.1)})
    assert plain[0].id == "a"  # fts position 1 + vector 2 beats vector 1 + fts 3
    assert [f.id for f in tied] == ["c", "a", "b"]  # the vector leg's order
    assert tied[0].ranks == {"fts": 3, "vector": 1} and tied[0].tied_ranks == {"fts": 2}
    assert tied[0].rrf == pytest.approx(1 / 62 + 1 / 61)


def test_a_single_leg_keeps_its_order_with_ties():
    fused = rrf({"fts": ["x", "y", "z"]}, {"fts": 1.0}, 60, {"fts": tie_ranks([2.0, 1.9, 1.0], 0.1)})
    assert [f.id for f in fused] == ["x", "y", "z"]
    assert [f.ranks["fts"] for f in fused] == [1, 2, 3]


def _state(text, fts, vector, settings=SETTINGS):
    q = make_query(text, {}, settings)
    return QueryState(query=q, legs={
        "vector": LegRun(leg="vector", ran=True, hits=[Hit(id=m, score=s, rank=i + 1) for i, (m, s) in enumerate(vector)]),
        "fts": LegRun(leg="fts", ran=True, hits=[Hit(id=m, score=s, rank=i + 1) for i, (m, s) in enumerate(fts)]),
    })


def test_the_fuse_stage_uses_the_setting_and_the_audit_row_explains_the_counted_ranks():
    fts = [("a", 5.0), ("b", 4.9), ("c", 4.8), ("d", 1.0)]
    vector = [("c", 0.8), ("a", 0.7), ("b", 0.6)]
    on = _state("priya raman pet", fts, vector)
    fuse_state(on, 60, LegWeighting.of(SETTINGS), lambda text: 5.0, SETTINGS.fts_tie_tolerance)
    off = _state("priya raman pet", fts, vector)
    fuse_state(off, 60, LegWeighting.of(SETTINGS), lambda text: 5.0, 0.0)
    assert SETTINGS.fts_tie_tolerance == 0.1
    assert on.fused[0].id == "c" and off.fused[0].id == "a"
    assert on.query.weights == off.query.weights  # ties change ranks, not the per-query weights
    # the row alone explains the served score: contributions use the counted rank
    from pipeline.contracts import Result
    on.results = [Result(rank=i + 1, id=f.id, score=f.score, rrf=f.rrf, ranks=f.ranks, tied_ranks=f.tied_ranks,
                         namespace="n", content_type="text", created_at="2026-01-01T00:00:00", content=f.id,
                         preview=f.id) for i, f in enumerate(on.fused)]
    row = build_record(on, 60, store_text=False)
    paths = explain(row)
    assert paths[0]["tied_ranks"] == {"fts": 2}
    for path, f in zip(paths, on.fused):
        assert sum(path["rrf_contributions"].values()) == pytest.approx(f.rrf)


def test_convex_fusion_is_not_affected():
    fts = [("a", 5.0), ("b", 4.9), ("c", 4.8)]
    vector = [("c", 0.8), ("a", 0.7), ("b", 0.6)]
    convex = SETTINGS.replace(fusion="convex")
    s1, s2 = _state("q", fts, vector, convex), _state("q", fts, vector, convex)
    fuse_state(s1, 60, LegWeighting.of(convex), None, 0.1)
    fuse_state(s2, 60, LegWeighting.of(convex), None, 0.0)
    assert [(f.id, f.score) for f in s1.fused] == [(f.id, f.score) for f in s2.fused]
    assert all(not f.tied_ranks for f in s1.fused)


def test_the_tolerance_is_checked():
    with pytest.raises(ValueError):
        Settings(_env_file=None, fts_tie_tolerance=1.0)
    with pytest.raises(ValueError):
        Settings(_env_file=None, fts_tie_tolerance=-0.1)
