"""Reciprocal rank fusion: hand-worked scores, weights, k, tie order, which
legs ``fuse_state`` fuses, the chord merge, and agreement with ranx."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipeline.contracts import Batch, Hit, LegRun, Query, QueryState
from pipeline.stages.fuse import fuse_state, merge_legs, rrf


def _ids(fused):
    return [f.id for f in fused]


def _state(weights, legs, qid="q1", vector=None):
    """A state whose legs are given as {name: (ran, [ids best first])}."""
    q = Query(id=qid, text="t", weights=weights, vector=vector)
    return QueryState(
        query=q,
        legs={
            name: LegRun(leg=name, ran=ran, hits=[Hit(id=m, score=1.0, rank=r) for r, m in enumerate(ids, 1)])
            for name, (ran, ids) in legs.items()
        },
    )


# -- rrf on hand-worked values ----------------------------------------------------
def test_memory_in_both_legs_scores_the_sum_of_reciprocals():
    # c is 3rd in vector and 1st in fts: 1/(60+3) + 1/(60+1).
    # a: 1/61 (vector 1st).  b: 1/62 (vector 2nd).  d: 1/62 (fts 2nd).
    fused = rrf({"vector": ["a", "b", "c"], "fts": ["c", "d"]}, {"vector": 1.0, "fts": 1.0}, 60)
    by_id = {f.id: f for f in fused}
    assert by_id["c"].rrf == 1 / 63 + 1 / 61
    assert by_id["a"].rrf == 1 / 61
    assert by_id["b"].rrf == by_id["d"].rrf == 1 / 62
    assert by_id["c"].ranks == {"vector": 3, "fts": 1}
    assert by_id["d"].ranks == {"fts": 2}
    # before any recency boost the score is the rrf score
    assert all(f.score == f.rrf for f in fused)
    # c (0.0326) > a (0.0164) > b = d (0.0161; both best rank 2, so by id)
    assert _ids(fused) == ["c", "a", "b", "d"]


def test_weights_multiply_each_legs_contribution():
    # c: 2/(60+3) + 0.5/(60+1); a: 2/61; d: 0.5/62
    fused = rrf({"vector": ["a", "b", "c"], "fts": ["c", "d"]}, {"vector": 2.0, "fts": 0.5}, 60)
    by_id = {f.id: f for f in fused}
    assert by_id["c"].rrf == pytest.approx(2 / 63 + 0.5 / 61, rel=1e-15)
    assert by_id["a"].rrf == pytest.approx(2 / 61, rel=1e-15)
    assert by_id["b"].rrf == pytest.approx(2 / 62, rel=1e-15)
    assert by_id["d"].rrf == pytest.approx(0.5 / 62, rel=1e-15)
    # c = 0.03175 + 0.00820 = 0.03995 > a = 0.03279 > b = 0.03226 > d = 0.00806
    assert _ids(fused) == ["c", "a", "b", "d"]


def test_weight_can_reorder_the_fusion():
    # Same lists, fts weighted 10x: d = 10/62 = 0.161 beats a = 1/61 = 0.016.
    fused = rrf({"vector": ["a", "b", "c"], "fts": ["c", "d"]}, {"vector": 1.0, "fts": 10.0}, 60)
    assert _ids(fused) == ["c", "d", "a", "b"]


def test_k_comes_from_the_argument():
    fused = rrf({"vector": ["a", "b", "c"], "fts": ["c", "d"]}, {"vector": 1.0, "fts": 1.0}, 10)
    by_id = {f.id: f for f in fused}
    assert by_id["c"].rrf == pytest.approx(1 / 13 + 1 / 11, rel=1e-15)
    assert by_id["a"].rrf == pytest.approx(1 / 11, rel=1e-15)
    assert by_id["d"].rrf == pytest.approx(1 / 12, rel=1e-15)


def test_ties_best_single_rank_first_then_id():
    # k = 1 keeps every score a power of two, so equal sums are exactly equal:
    #   yak  = 1/(1+1)            = 1/2  (vector 1st)
    #   zeta = 1/(1+1)            = 1/2  (fts 1st)
    #   alpha= 1/(1+3) + 1/(1+3)  = 1/2  (3rd in both; best single rank 3)
    #   kiwi = 1/(1+2) (vector 2nd), pear = 1/(1+2) (fts 2nd)
    fused = rrf({"fts": ["zeta", "pear", "alpha"], "vector": ["yak", "kiwi", "alpha"]}, {}, 1)
    assert [f.rrf for f in fused][:3] == [0.5, 0.5, 0.5]
    # equal score -> best single rank (yak, zeta rank 1 before alpha rank 3) -> then id
    assert _ids(fused) == ["yak", "zeta", "alpha", "kiwi", "pear"]


def test_missing_weight_counts_as_one():
    fused = rrf({"fts": ["a"]}, {}, 60)
    assert fused[0].rrf == 1 / 61


def test_empty_legs_fuse_to_nothing():
    assert rrf({}, {"vector": 1.0}, 60) == []
    assert rrf({"vector": [], "fts": []}, {"vector": 1.0, "fts": 1.0}, 60) == []


@hsettings(max_examples=100, deadline=None)
@given(
    vec=st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8),
    fts=st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8),
)
def test_order_does_not_depend_on_leg_dict_order(vec, fts):
    w = {"vector": 1.0, "fts": 1.0}
    one = rrf({"vector": vec, "fts": fts}, w, 60)
    two = rrf({"fts": fts, "vector": vec}, w, 60)
    assert one == two
    # every id once, scores non-increasing, recorded ranks are the list positions
    assert sorted(_ids(one)) == sorted(set(vec) | set(fts))
    assert all(a.rrf >= b.rrf for a, b in zip(one, one[1:]))
    for f in one:
        if "vector" in f.ranks:
            assert vec[f.ranks["vector"] - 1] == f.id
        if "fts" in f.ranks:
            assert fts[f.ranks["fts"] - 1] == f.id


# -- fuse_state ------------------------------------------------------------------
def test_leg_with_weight_zero_is_not_fused_even_with_hits():
    state = _state({"vector": 0.0, "fts": 1.0}, {"vector": (True, ["v1", "v2"]), "fts": (True, ["f1", "v1"])})
    fuse_state(state, 60)
    assert _ids(state.fused) == ["f1", "v1"]
    assert state.fused[1].rrf == 1 / 62  # only its fts rank counts
    assert all(set(f.ranks) == {"fts"} for f in state.fused)


def test_leg_that_did_not_run_is_not_fused():
    state = _state({"vector": 1.0, "fts": 1.0}, {"vector": (False, ["v1"]), "fts": (True, ["f1"])})
    fuse_state(state, 60)
    assert _ids(state.fused) == ["f1"]


def test_fuse_state_uses_the_given_k_and_fills_missing_legs():
    state = _state({"vector": 1.0, "fts": 1.0}, {"fts": (True, ["a", "b"])}, vector=[0.1, 0.2])
    fuse_state(state, 5)
    assert [f.rrf for f in state.fused] == [1 / 6, 1 / 7]
    assert set(state.legs) == {"vector", "fts"} and not state.legs["vector"].ran
    assert state.query.vector is None  # consumed; keeps the wire small
    assert "fuse" in state.timings


# -- merge_legs ------------------------------------------------------------------
def _parts():
    vec_states, fts_states = [], []
    for qid in ("q1", "q2"):
        v = _state({"vector": 1.0, "fts": 1.0}, {"vector": (True, [f"{qid}-v"])}, qid=qid, vector=[1.0, 0.0])
        v.timings = {"embed": 1.5, "descend": 2.5}
        f = _state({"vector": 1.0, "fts": 1.0}, {"fts": (True, [f"{qid}-f"])}, qid=qid)
        f.timings = {"fulltext": 3.5}
        vec_states.append(v)
        fts_states.append(f)
    return [Batch(states=vec_states), Batch(states=fts_states)]


def test_merge_legs_joins_the_two_chord_parts():
    parts = _parts()
    before = parts[0].model_copy(deep=True)
    merged = merge_legs(parts)
    assert [s.query.id for s in merged.states] == ["q1", "q2"]
    for s in merged.states:
        qid = s.query.id
        assert set(s.legs) == {"vector", "fts"}
        assert [h.id for h in s.legs["vector"].hits] == [f"{qid}-v"]
        assert [h.id for h in s.legs["fts"].hits] == [f"{qid}-f"]
        assert s.timings == {"embed": 1.5, "descend": 2.5, "fulltext": 3.5}
        assert s.query.vector == [1.0, 0.0]
    assert parts[0] == before  # the parts are not modified


def test_merge_legs_order_of_parts_does_not_lose_the_vector():
    merged = merge_legs(list(reversed(_parts())))
    assert all(s.query.vector == [1.0, 0.0] for s in merged.states)
    assert all(set(s.legs) == {"vector", "fts"} for s in merged.states)


def test_merge_legs_keeps_a_timed_out_leg_that_only_one_part_has():
    parts = _parts()
    for s in parts[0].states:
        s.legs["vector"] = LegRun(leg="vector", ran=False, profile={"timed_out": True})
    merged = merge_legs(parts)
    assert all(s.legs["vector"].profile == {"timed_out": True} for s in merged.states)


def test_merge_legs_refuses_parts_in_different_query_order():
    parts = _parts()
    parts[1].states.reverse()
    with pytest.raises(ValueError, match="query order"):
        merge_legs(parts)


def test_merged_then_fused_uses_both_legs():
    merged = merge_legs(_parts())
    state = fuse_state(merged.states[0], 60)
    # q1-v is 1st in vector, q1-f 1st in fts: both 1/61, best rank 1 -> by id
    assert _ids(state.fused) == ["q1-f", "q1-v"]
    assert state.mode == "hybrid"


# -- agreement with ranx ---------------------------------------------------------
@pytest.mark.slow  # ranx compiles its functions on first call, per id width: 20-45 s on a fresh install
def test_rrf_agrees_with_ranx_on_random_runs():
    from ranx import Run, fuse

    rng = np.random.default_rng(20240601)
    pool = [f"d{i:02d}" for i in range(40)]
    legs_by_query = {}
    for q in range(6):
        legs_by_query[f"q{q}"] = {
            leg: [pool[i] for i in rng.permutation(len(pool))[: int(rng.integers(1, 25))]]
            for leg in ("vector", "fts")
        }

    def as_run(leg):
        # strictly decreasing scores in list order, so ranx ranks = list positions
        return Run({q: {d: float(100 - i) for i, d in enumerate(legs[leg])} for q, legs in legs_by_query.items()})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba type-safety chatter
        fused = fuse([as_run("vector"), as_run("fts")], norm=None, method="rrf", params={"k": 60})
    for q, legs in legs_by_query.items():
        ours = {f.id: f.rrf for f in rrf(legs, {"vector": 1.0, "fts": 1.0}, 60)}
        theirs = {d: float(s) for d, s in fused.run[q].items()}
        assert set(ours) == set(theirs)
        for d in ours:
            assert ours[d] == pytest.approx(theirs[d], rel=1e-12, abs=1e-15)


def test_fusion_keeps_the_top_hits_and_their_count():
    """After fusion a leg carries only its first TOP_HITS hits (the audit's top
    scores) and how many it had; callers and the audit row still see the count."""
    from pipeline.audit.record import build_record
    from pipeline.contracts import TOP_HITS, Results

    fts = [f"f{i}" for i in range(12)]
    state = _state({"vector": 1.0, "fts": 1.0}, {"fts": (True, fts), "vector": (True, ["v1", "f3"])})
    hits_before = [h.model_copy() for h in state.legs["fts"].hits]
    fuse_state(state, 60)
    fts_leg = state.legs["fts"]
    assert fts_leg.hits == hits_before[:TOP_HITS] and fts_leg.n_hits == 12
    assert state.legs["vector"].n_hits == 2 and len(state.legs["vector"].hits) == 2
    assert len(state.fused) == 13 and next(f for f in state.fused if f.id == "f11").ranks == {"fts": 12}
    again = LegRun.model_validate_json(fts_leg.model_dump_json())  # survives the wire
    again.keep_top()  # idempotent
    assert again.n_hits == 12 and again.hits == hits_before[:TOP_HITS]
    assert Results.from_state(state).legs["fts"]["hits"] == 12
    row = build_record(state, 60, True)
    assert row.query_profile["legs"]["fts"]["hits"] == 12
    assert row.query_profile["legs"]["fts"]["top_scores"] == [round(h.score, 6) for h in hits_before[:5]]


def test_vectors_are_dropped_once_the_vector_leg_has_run():
    from pipeline.contracts import vectors_consumed

    batch = Batch(states=[_state({"vector": 1.0, "fts": 1.0}, {}, vector=[0.5, 0.5])])
    assert vectors_consumed(batch).states[0].query.vector is None
