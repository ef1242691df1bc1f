"""``ops.bench.fusion``'s offline side on constructed caches: the leg rows
score the legs' own lists, RRF candidates are ``pipeline.stages.fuse.rrf``'s
order, convex fusion follows the normalised scores, and the signals read what
the lists say."""

from __future__ import annotations

import statistics

import pytest

from ops.bench import fusion
from pipeline.stages.fuse import rrf


def _cache(name="s"):
    # q1: only the vector leg finds d1; q2: only the full-text leg finds d9 (at rank 1)
    return {"set": name, "n_docs": 100, "queries": [
        {"id": "q1", "text": "a", "qrels": {"d1": 1}, "terms": [["x", 3], ["y", 0]],
         "vector": [["d1", 0.9], ["d2", 0.5], ["d3", 0.4]], "fts": [["d4", 7.0], ["d5", 2.0]]},
        {"id": "q2", "text": "b", "qrels": {"d9": 1}, "terms": [["z", 1]],
         "vector": [["d7", 0.6], ["d8", 0.55], ["d9", 0.1]], "fts": [["d9", 9.0], ["d7", 1.0]]},
    ]}


def test_leg_rows_and_rrf_rows_score_what_they_say():
    result = fusion.evaluate([_cache()])
    t = result["table"]
    assert t["vector only"]["s"]["recall@10"] == 1.0  # both relevant within the vector top 3
    assert t["fts only"]["s"]["recall@10"] == 0.5
    assert t["vector only"]["s"]["ndcg@10"] == pytest.approx((1 + 0.5) / 2)  # d9 at rank 3: 1/log2(4)
    q = _cache()["queries"][1]
    fused = [f.id for f in rrf({"vector": ["d7", "d8", "d9"], "fts": ["d9", "d7"]}, {"vector": 1, "fts": 1}, 60)]
    assert fusion.candidates()["rrf 1:1"](q, {}) == fused == ["d7", "d9", "d8"]
    assert set(result["per_query"]["rrf 1:1"]["s"]) == {"q1", "q2"}


def test_convex_follows_normalised_scores():
    q = _cache()["queries"][1]
    # vector minmax: d7 1, d8 0.9, d9 0; fts: d9 1, d7 0. a=0.3: d9 0.7, d7 0.3, d8 0.27
    assert fusion.convex(0.3)(q, {}) == ["d9", "d7", "d8"]
    assert fusion.convex(0.7)(q, {})[0] == "d7"


def test_signals():
    q1, q2 = _cache()["queries"]
    s1, s2 = fusion.signals(q1, 100), fusion.signals(q2, 100)
    assert 0 < s1["coverage"] < 1 and s2["coverage"] == 1.0  # y is in no memory
    assert s1["agreement"] == 0.0 and s2["agreement"] == 0.2
    assert s1["vec_margin"] == pytest.approx(0.5)
    assert s2["fts_gap"] == pytest.approx((9 - 1) / 9)
    v1 = [x for _, x in q1["vector"]]
    assert s1["vec_z"] == pytest.approx((v1[0] - sum(v1) / len(v1)) / statistics.pstdev(v1))


def test_markdown_marks_who_matches_the_best_leg():
    md = fusion.markdown(fusion.evaluate([_cache("a"), _cache("b")]))
    assert "| vector only | 0.750 / 1.000 | 0.750 / 1.000 | - | - |" in md
    assert "| fts only |" in md and md.count("\n") == len(fusion.candidates()) + 2
