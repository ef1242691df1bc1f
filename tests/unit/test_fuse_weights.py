"""Per-query hybrid weights (``fusion_weights = lexical_match``): the match of
the full-text leg's best hit against the whole query sets the full-text leg's
weight; a query's own weights, single-leg modes and ``fixed`` are left alone;
the weights used are the query's (the audit row's RRF terms)."""

from __future__ import annotations

import pytest

from pipeline.contracts import Hit, LegRun, QueryOptions, QueryState, make_query
from pipeline.settings import Settings
from pipeline.stages.fuse import LegWeighting, fuse_state, lexical_match
from pipeline.store.fulltext import idf as bm25_idf

SETTINGS = Settings(_env_file=None)


def _state(text="q", options=None, vector=("a", "b", "c"), fts=(("c", 3.0), ("d", 1.0))):
    q = make_query(text, QueryOptions.model_validate(options or {}), SETTINGS)
    return QueryState(query=q, legs={
        "vector": LegRun(leg="vector", ran=True, hits=[Hit(id=m, score=0.9 - i / 10, rank=i + 1) for i, m in enumerate(vector)]),
        "fts": LegRun(leg="fts", ran=True, hits=[Hit(id=m, score=s, rank=i + 1) for i, (m, s) in enumerate(fts)]),
    })


def test_lexical_match_is_the_top_score_over_the_query_idf_capped():
    assert lexical_match(1.5, 3.0) == 0.5
    assert lexical_match(4.0, 3.0) == 1.0
    assert lexical_match(0.0, 3.0) == lexical_match(2.0, 0.0) == 0.0
    # a term in no memory weighs most; a term in every memory least
    assert bm25_idf(0, 100) > bm25_idf(1, 100) > bm25_idf(50, 100) > bm25_idf(100, 100) > 0


def test_full_text_weight_follows_the_match():
    weighting = LegWeighting.of(SETTINGS)
    assert (weighting.how, weighting.scale, weighting.power) == ("lexical_match", 8.0, 2.0)
    strong, weak = _state(), _state()
    fuse_state(strong, 60, weighting, lambda text: 3.0)  # top hit 3.0 of 3.0: full match
    fuse_state(weak, 60, weighting, lambda text: 12.0)  # 3.0 of 12.0: a quarter
    assert strong.query.weights == {"vector": 1.0, "fts": 8.0}
    assert weak.query.weights == {"vector": 1.0, "fts": pytest.approx(8.0 * 0.25 ** 2)}
    assert strong.legs["fts"].profile["lexical_match"] == 1.0 and weak.legs["fts"].profile["lexical_match"] == 0.25
    # full match: the lexical leg's order leads (d, 2nd in full text only, above a, 1st in vector only)
    assert [f.id for f in strong.fused][:2] == ["c", "d"]
    # weak match: the vector leg's order leads, the lexical hits count little
    assert [f.id for f in weak.fused][:3] == ["c", "a", "b"] and weak.fused[-1].id == "d"
    # the RRF scores are the weights used
    by_id = {f.id: f for f in strong.fused}
    assert by_id["d"].rrf == pytest.approx(8.0 / 62)


def test_no_lexical_hits_fuses_the_vector_order():
    s = _state(fts=())
    fuse_state(s, 60, LegWeighting.of(SETTINGS), lambda text: 5.0)
    assert s.query.weights["fts"] == 0.0 and [f.id for f in s.fused] == ["a", "b", "c"]


@pytest.mark.parametrize("options", [{"weights": {"vector": 0.4, "fts": 1.0}}, {"mode": "keyword"}, {"mode": "semantic"}])
def test_asked_weights_and_single_leg_modes_are_left_alone(options):
    s = _state(options=options)
    before = dict(s.query.weights)
    fuse_state(s, 60, LegWeighting.of(SETTINGS), lambda text: 3.0)
    assert s.query.weights == before and "lexical_match" not in s.legs["fts"].profile


def test_fixed_uses_the_configured_weights():
    fixed = Settings(_env_file=None, fusion_weights="fixed")
    s = _state()
    fuse_state(s, 60, LegWeighting.of(fixed), lambda text: 3.0)
    assert s.query.weights == {"vector": fixed.vector_weight, "fts": fixed.fts_weight} == {"vector": 0.4, "fts": 1.0}


def test_a_timed_out_lexical_leg_keeps_the_weights():
    s = _state()
    s.legs["fts"].ran = False
    before = dict(s.query.weights)
    fuse_state(s, 60, LegWeighting.of(SETTINGS), lambda text: 3.0)
    assert s.query.weights == before
