"""``ops.bench.fusion``'s offline side on constructed caches: the leg rows
score the legs' own lists, RRF candidates are ``pipeline.stages.fuse.rrf``'s
order, convex fusion follows the normalised scores, the signal reads what
the lists say, and leaving one set out chooses on the other sets only."""

from __future__ import annotations

import random

import pytest

from ops.bench import fusion
from pipeline.stages.fuse import convex, rrf
from pipeline.store.fulltext import idf


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
    assert fusion.candidates()["rrf k=60 1:1"](fusion.Lists(q), {}) == fused == ["d7", "d9", "d8"]
    # k 10 and the vector leg at 0.4: d9's full-text first place (1/11) beats d7's 0.4/11 + 1/12
    assert fusion.candidates()["rrf k=10 0.4:1"](fusion.Lists(q), {}) == ["d9", "d7", "d8"]
    assert set(result["per_query"]["rrf k=60 1:1"]["s"]) == {"q1", "q2"}
    assert result["family"]["vector only"] == "leg" and result["family"]["convex a=0.4"] == "convex"


def test_convex_follows_normalised_scores():
    q = fusion.Lists(_cache()["queries"][1])
    # vector minmax: d7 1, d8 0.9, d9 0; fts: d9 1, d7 0. a=0.3: d9 0.7, d7 0.3, d8 0.27
    assert fusion.convex(0.3)(q, {}) == ["d9", "d7", "d8"]
    assert fusion.convex(0.7)(q, {})[0] == "d7"


def test_convex_z_sums_shares_of_z_scores_and_a_miss_counts_as_the_legs_lowest():
    q = fusion.Lists(_cache()["queries"][1])
    # vector z: d7 0.82, d8 0.59, d9 -1.41 (mean 0.4167, sd 0.2248); fts z: d9 1, d7 -1
    # shifted by each list's lowest: vector d7 2.22, d8 2.00, d9 0; fts d9 2, d7 0
    assert fusion.convex(0.5, "zscore")(q, {}) == ["d7", "d8", "d9"]  # d7 1.11, d8 1.00, d9 1.00: d8's best rank 2
    assert fusion.convex(0.3, "zscore")(q, {}) == ["d9", "d7", "d8"]  # d9 1.4, d7 0.67, d8 0.60


def test_convex_tmm_measures_each_leg_from_the_lowest_score_it_could_give():
    q = fusion.Lists(_cache()["queries"][1])
    # vector (cosine, from -1): d7 1.6/1.6 = 1, d8 1.55/1.6 = 0.969, d9 1.1/1.6 = 0.6875; fts (from 0): d9 1, d7 1/9
    # a=0.5: d7 0.5 + 0.0556 = 0.556, d9 0.344 + 0.5 = 0.844, d8 0.484 (min-max would give d9 0.5, d7 0.5)
    assert fusion.convex(0.5, "tmm")(q, {}) == ["d9", "d7", "d8"]
    # a=0.9: d7 0.9 + 0.011 = 0.911, d8 0.872, d9 0.619 + 0.1 = 0.719
    assert fusion.convex(0.9, "tmm")(q, {}) == ["d7", "d8", "d9"]
    # a list's depth does not move it: the same top scores with a weaker tail normalise the same
    deeper = _cache()["queries"][1] | {"vector": [["d7", 0.6], ["d8", 0.55], ["d9", 0.1], ["d6", -0.5]]}
    assert fusion._tmm(fusion.Lists(deeper), "vector")[:3].tolist() == fusion._tmm(q, "vector")[:3].tolist()
    assert fusion._minmax(fusion.Lists(deeper), "vector")[:3].tolist() != fusion._minmax(q, "vector")[:3].tolist()


def _random_query(rng: random.Random) -> dict:
    ids = [f"m{i}" for i in range(150)]
    vec = sorted(((d, round(rng.uniform(0.1, 0.9), 3)) for d in rng.sample(ids, rng.randint(0, 100))),
                 key=lambda x: -x[1])
    # BM25 scores with runs of near-equal values (the tie rule's case) and exact ties
    fts = sorted(((d, round(rng.choice([12.0, 11.5, 8.0, 7.9, 4.0, 2.0]) * rng.uniform(0.95, 1.0), 1))
                  for d in rng.sample(ids, rng.randint(0, 100))), key=lambda x: -x[1])
    return {"vector": [list(x) for x in vec], "fts": [list(x) for x in fts]}


def test_the_array_candidates_order_as_the_engines_functions_do():
    rng = random.Random(31)
    for _ in range(60):
        q = _random_query(rng)
        lists, legs = fusion.Lists(q), {leg: [d for d, _ in q[leg]] for leg in fusion.LEG_NAMES}
        for wv, k in ((0.4, 60), (1.0, 10), (2.0, 60)):
            engine = [f.id for f in rrf(legs, {"vector": wv, "fts": 1.0}, k)][:10]
            assert fusion.rrf_fixed(wv, 1.0, k)(lists, {}) == engine
        # issue 16's rules (no longer the engine's): RRF over the ranks counted_ranks gives, by hand
        floor = 0.5 if q["vector"] and q["fts"] else 0.0
        counted = dict(zip(legs["fts"], fusion.counted_ranks([x for _, x in q["fts"]], 0.1, floor)))
        vrank = {d: i for i, d in enumerate(legs["vector"], start=1)}
        frank = {d: i for i, d in enumerate(legs["fts"], start=1)}
        by_hand = {d: (1.0 / (60 + counted[d]) if counted.get(d) is not None else 0.0)
                   + (1.0 / (60 + vrank[d]) if d in vrank else 0.0) for d in set(vrank) | set(frank)}
        best = {d: min(vrank.get(d, 10**6), frank.get(d, 10**6)) for d in by_hand}
        expected = sorted(by_hand, key=lambda d: (-by_hand[d], best[d], d))[:10]
        assert fusion.rrf_fixed(1.0, 1.0, 60, 0.1, 0.5)(lists, {}) == expected
        for alpha in (0.2, 0.5, 0.85):
            engine = [f.id for f in convex({leg: [(d, x) for d, x in q[leg]] for leg in fusion.LEG_NAMES},
                                           {"vector": alpha, "fts": 1 - alpha})][:10]
            assert fusion.convex(alpha)(lists, {}) == engine
            # with leg_top_k = 30 the engine fuses each leg's 30 best
            engine = [f.id for f in convex({leg: [(d, x) for d, x in q[leg][:30]] for leg in fusion.LEG_NAMES},
                                           {"vector": alpha, "fts": 1 - alpha})][:10]
            assert fusion.convex_at(alpha, 30)(lists, {}) == engine


def test_a_shallower_cut_moves_min_max_and_drops_what_one_leg_found_below_it():
    q = _cache()["queries"][1]  # vector d7 0.6, d8 0.55, d9 0.1; fts d9 9, d7 1
    lists = fusion.Lists(q)
    assert fusion.convex_at(0.5, 100)(lists, {}) == fusion.convex(0.5)(lists, {})  # the cache's own depth
    # a=0.7, all three deep: vector d7 1, d8 0.9, d9 0; fts d9 1, d7 0: d7 0.7, d8 0.63, d9 0.3
    assert fusion.convex(0.7)(lists, {}) == ["d7", "d8", "d9"]
    # two deep: vector d7 1, d8 0 (the lowest now; d9 below the cut); fts d9 1, d7 0: d7 0.7, d9 0.3, d8 0
    assert fusion.convex_at(0.7, 2)(lists, {}) == ["d7", "d9", "d8"]
    assert fusion.convex_at(0.5, 1)(lists, {}) == ["d7", "d9"]  # each leg's best, both 1: tied, then by id


def test_issue_16s_rules_as_they_were():
    assert fusion.tie_ranks([10.0, 9.5, 9.1, 8.0, 7.9, 3.0], 0.1) == [2, 2, 2, 4.5, 4.5, 6]
    assert fusion.counted_ranks([10.0, 9.5, 6.0, 5.5, 4.9, 1.0], 0.1, 0.5) == [1.5, 1.5, 3.5, 3.5, None, None]
    assert fusion.lexical_match(1.5, 3.0) == 0.5 and fusion.lexical_match(4.0, 3.0) == 1.0


def test_the_signal_is_the_lexical_match():
    q1, q2 = _cache()["queries"]
    assert fusion.signals(q2, 100)["fts_top_norm"] == 1.0  # 9.0 over z's IDF (< 9): capped
    whole = idf(3, 100) + idf(0, 100)
    assert fusion.signals(q1, 100)["fts_top_norm"] == pytest.approx(min(1.0, 7.0 / whole))
    assert fusion.signals({**q1, "fts": []}, 100)["fts_top_norm"] == 0.0


def _result(rows: dict[str, list[float]]) -> dict:
    """A constructed evaluation: nDCG@10 (and R@10 alike) per set a..d."""
    sets = ["a", "b", "c", "d"]
    table = {name: {s: {"ndcg@10": v, "recall@10": v} for s, v in zip(sets, values)} for name, values in rows.items()}
    family = {name: ("leg" if name in ("vector only", "fts only") else "rrf") for name in rows}
    return {"table": table, "sets": sets, "family": family}


def test_leave_one_out_chooses_on_the_other_sets_and_reports_the_left_out_figure():
    result = _result({
        "vector only": [0.5, 0.5, 0.5, 0.5],
        "fts only": [0.4, 0.6, 0.4, 0.4],
        "x": [0.9, 0.1, 0.6, 0.6],   # best mean on every set (0.55), and on every fold but a's
        "y": [0.5, 0.5, 0.55, 0.55],  # best on b, c, d (0.533) once a is left out
    })
    run = fusion.leave_one_out(result)
    folds = {f["left_out"]: f for f in run["folds"]}
    assert folds["a"]["chosen"] == "y" and folds["a"]["ndcg@10"] == 0.5  # y's figure on a, not x's 0.9
    assert folds["b"]["chosen"] == "x" and folds["b"]["ndcg@10"] == 0.1
    assert folds["b"]["vs_better_leg"] == pytest.approx(0.1 - 0.6)
    assert run["final"] == "x" and run["left_out_mean"] == pytest.approx((0.5 + 0.1 + 0.6 + 0.6) / 4)


def test_ties_on_the_mean_go_to_the_smaller_worst_gap_to_the_better_leg():
    result = _result({
        "vector only": [0.5, 0.5, 0.5, 0.5],
        "fts only": [0.5, 0.5, 0.5, 0.5],
        "low": [0.3, 0.7, 0.5, 0.5],
        "even": [0.5, 0.5, 0.5, 0.5],
    })
    assert fusion.choose(result["table"], ["low", "even"], result["sets"]) == "even"
    assert fusion.objective(result["table"], "low", result["sets"]) == (0.5, -0.2)


def test_markdown_has_a_row_per_candidate_and_marks_the_legs():
    md = fusion.markdown(fusion.evaluate([_cache("a"), _cache("b")]))
    assert "| vector only | 0.750 / 1.000 | 0.750 / 1.000 | 0.7500 | - |" in md
    assert "| fts only |" in md and md.count("\n") == len(fusion.candidates()) + 2


def test_every_pool_names_known_families():
    assert all(set(families) <= set(fusion.FAMILIES) - {"leg"} for families in fusion.POOLS.values())
    assert fusion.OLD_DEFAULT in fusion.candidates()
