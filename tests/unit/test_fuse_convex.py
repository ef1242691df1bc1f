"""Convex fusion (``fusion = "convex"``, a setting or a query's option): each
leg's scores min-max normalised over its hits, summed with the leg weights as
shares; resolved once by ``make_query``, recorded and asked again on replay."""

from __future__ import annotations

import random

import pytest

from pipeline.contracts import Batch, Fusion, Hit, LegRun, QueryOptions, QueryState, make_query, options_from_recorded
from pipeline.errors import InputError
from pipeline.settings import Settings
from pipeline.stages.fuse import convex, fuse_batch, fuse_state

SETTINGS = Settings(_env_file=None)
CONVEX = SETTINGS.replace(convex_alpha=0.4)  # convex is the default (issue 31); alpha 0.4 for hand-worked figures
RRF = SETTINGS.replace(fusion="rrf")


def test_scores_are_the_weighted_sum_of_min_max_normalised_scores():
    fused = convex({"vector": [("a", 0.9), ("b", 0.7), ("c", 0.5)], "fts": [("c", 12.0), ("d", 4.0)]},
                   {"vector": 0.4, "fts": 0.6})
    got = {f.id: f.score for f in fused}
    # vector: a 1, b 0.5, c 0; fts: c 1, d 0; a memory a leg did not return gets 0 from it
    assert got == pytest.approx({"a": 0.4, "b": 0.2, "c": 0.6, "d": 0.0})
    assert [f.id for f in fused] == ["c", "a", "b", "d"]
    assert {f.id: f.ranks for f in fused}["c"] == {"vector": 3, "fts": 1}
    assert all(f.rrf == f.score for f in fused)


def test_weights_count_as_shares_of_their_sum():
    legs = {"vector": [("a", 0.9), ("b", 0.1)], "fts": [("b", 3.0), ("a", 1.0)]}
    assert ([(f.id, f.score) for f in convex(legs, {"vector": 2.0, "fts": 3.0})]
            == [(f.id, f.score) for f in convex(legs, {"vector": 0.4, "fts": 0.6})])


def test_scores_on_any_scale_give_the_same_order():
    rng = random.Random(7)
    vec = [(f"m{i}", rng.random()) for i in range(40)]
    fts = [(f"m{i}", rng.random() * 30) for i in rng.sample(range(60), 30)]
    vec.sort(key=lambda x: -x[1])
    fts.sort(key=lambda x: -x[1])
    w = {"vector": 0.4, "fts": 0.6}
    scaled = [(m, 5 * s + 100) for m, s in fts]  # BM25 scores of another corpus: same shape, other scale
    assert [f.id for f in convex({"vector": vec, "fts": fts}, w)] == [f.id for f in convex({"vector": vec, "fts": scaled}, w)]


def test_one_hit_or_equal_scores_count_fully_and_ties_go_to_the_best_rank_then_the_id():
    fused = convex({"vector": [("b", 0.3), ("a", 0.3)], "fts": [("z", 2.0)]}, {"vector": 0.5, "fts": 0.5})
    assert [(f.id, f.score) for f in fused] == [("b", 0.5), ("z", 0.5), ("a", 0.5)]
    assert convex({"vector": [], "fts": []}, {"vector": 1, "fts": 1}) == []


def _state(options=None, settings=CONVEX):
    q = make_query("deploy window", QueryOptions.model_validate(options or {}), settings)
    return QueryState(query=q, legs={
        "vector": LegRun(leg="vector", ran=True, hits=[Hit(id=m, score=s, rank=i + 1) for i, (m, s) in
                                                       enumerate((("a", 0.8), ("b", 0.79), ("c", 0.2)))]),
        "fts": LegRun(leg="fts", ran=True, hits=[Hit(id=m, score=s, rank=i + 1) for i, (m, s) in
                                                 enumerate((("c", 9.0), ("b", 8.5), ("d", 1.0)))]),
    })


def test_the_default_is_convex_and_resolves_hybrid_weights_to_alpha():
    assert SETTINGS.fusion == "convex" and SETTINGS.convex_alpha == 0.45
    assert make_query("deploy window", None, SETTINGS).weights == {"vector": 0.45, "fts": pytest.approx(0.55)}
    s = _state()
    assert s.query.fusion is Fusion.convex and s.query.weights == {"vector": 0.4, "fts": pytest.approx(0.6)}
    fuse_state(s, 60)
    assert s.query.weights == {"vector": 0.4, "fts": pytest.approx(0.6)}
    # b: 0.4 * 0.983 + 0.6 * 0.9375 beats c (0 + 0.6) and a (0.4): scores, not ranks, decide
    assert [f.id for f in s.fused] == ["b", "c", "a", "d"]


def test_rrf_on_the_same_lists_orders_them_otherwise():
    s = _state({"fusion": "rrf"})
    fuse_state(s, 60)
    assert s.query.fusion is Fusion.rrf and s.fused[0].id != "b"


def test_a_query_asks_for_convex_over_the_rrf_setting_and_its_weights_are_used():
    s = _state({"fusion": "convex", "weights": {"vector": 3, "fts": 1}}, RRF)
    fuse_state(s, 60)
    assert s.query.fusion is Fusion.convex and s.query.weights == {"vector": 3, "fts": 1}
    assert [f.id for f in s.fused][:2] == ["b", "a"]  # 0.75 * 0.983 + 0.25 * 0.9375 = 0.97 > 0.75 (a)


def test_single_leg_modes_keep_the_leg_order():
    s = _state({"mode": "keyword"})
    fuse_state(s, 60)
    assert [f.id for f in s.fused] == ["c", "b", "d"]


def test_an_unknown_fusion_is_a_typed_error_naming_the_field():
    with pytest.raises(InputError) as err:
        make_query("q", {"fusion": "linear"}, SETTINGS)
    assert err.value.field == "fusion" and "convex" in str(err.value)
    with pytest.raises(ValueError):
        Settings(_env_file=None, convex_alpha=1.5)


def test_the_fusion_is_recorded_and_asked_again():
    recorded = _state().query.recorded()
    assert recorded["fusion"] == "convex"
    again = make_query("deploy window", options_from_recorded(recorded), RRF)  # the setting changed since
    assert again.fusion is Fusion.convex
    # a row from before the option was fused by RRF, and is asked again so
    old = {k: v for k, v in recorded.items() if k != "fusion"}
    assert make_query("deploy window", options_from_recorded(old), CONVEX).fusion is Fusion.rrf


def test_a_sweep_weights_axis_under_convex_sets_the_shares_the_queries_use():
    from pipeline.evaluation.sweep import apply_config

    for base, alpha in ((CONVEX, 0.25), (RRF, RRF.convex_alpha)):
        swept, _ = apply_config(base, {}, {"weights": (1.0, 3.0)})
        q = make_query("deploy window", QueryOptions(), swept)
        assert swept.convex_alpha == pytest.approx(alpha)  # RRF's weights are not shares: alpha stays
        if base is CONVEX:
            assert q.weights == {"vector": pytest.approx(0.25), "fts": pytest.approx(0.75)}
        else:
            assert q.fusion is Fusion.rrf and q.weights == {"vector": 1.0, "fts": 3.0}


def test_a_sweep_rrf_k_axis_sweeps_rrf_under_the_convex_default():
    from pipeline.evaluation.sweep import apply_config

    swept, _ = apply_config(CONVEX, {}, {"rrf_k": 30, "weights": (1.0, 3.0)})
    q = make_query("deploy window", QueryOptions(), swept)
    assert (swept.rrf_k, q.fusion) == (30, Fusion.rrf)
    assert q.weights == {"vector": 1.0, "fts": 3.0} and swept.convex_alpha == CONVEX.convex_alpha


def _legs_of(state: QueryState) -> list[Batch]:
    """``state`` as the two chord parts ``search.fuse`` receives (one leg each)."""
    parts = []
    for leg in ("vector", "fts"):
        part = state.model_copy(deep=True)
        part.legs = {leg: state.legs[leg]}
        parts.append(Batch(states=[part]))
    return parts


def test_the_fuse_stage_resolves_the_fusion_a_query_left_open_from_the_serving_settings():
    # made by a client that sees plain RRF (no tuned file in its data dir); the
    # workers serve a store tuned to convex alpha 0.4 (``Resources.settings()``)
    made = _state(settings=RRF)
    assert made.query.fusion is Fusion.rrf
    out = fuse_batch(_legs_of(made), 60, lambda ids: {}, CONVEX).states[0]
    here = _state(settings=CONVEX)
    fuse_state(here, 60)
    assert out.query.fusion is Fusion.convex and out.query.weights == here.query.weights
    assert [(f.id, f.score) for f in out.fused] == [(f.id, f.score) for f in here.fused]
    assert out.query.recorded()["fusion"] == "convex"  # what the audit row says was in effect


@pytest.mark.parametrize("options", [{"fusion": "rrf"}, {"fusion": "rrf", "weights": {"vector": 3, "fts": 1}},
                                     {"weights": {"vector": 3, "fts": 1}}, {"mode": "keyword"}])
def test_what_a_query_asks_for_itself_is_not_resolved_again(options):
    made = _state(options, settings=RRF)
    out = fuse_batch(_legs_of(made), 60, lambda ids: {}, CONVEX).states[0]
    # the query's own weights or mode stand; its fusion stands where it asked for one, else the store's
    alone = _state(options, settings=RRF if "fusion" in options else CONVEX)
    fuse_state(alone, 60)
    assert (out.query.fusion, out.query.weights) == (alone.query.fusion, alone.query.weights)
    assert out.query.weights == made.query.weights
    assert [(f.id, f.score) for f in out.fused] == [(f.id, f.score) for f in alone.fused]
