"""Retrieval metrics on a hand-worked example, and agreement with ranx."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from pipeline.metrics import METRICS, evaluate, mrr_at, ndcg_at, recall_at

# One query, hand-worked.
#   ranked: d1 d2 d3 d4            (d2 and d4 relevant, d9 relevant but never retrieved)
#   grades: d2 = 2, d4 = 1, d9 = 1, d7 = 0 (judged not relevant)
RANKED = ["d1", "d2", "d3", "d4"]
RELS = {"d2": 2, "d4": 1, "d9": 1, "d7": 0}


def test_ndcg_hand_worked():
    # DCG@10  = 0/log2(2) + 2/log2(3) + 0/log2(4) + 1/log2(5)       = 1.26186 + 0.43068 = 1.69254
    # IDCG@10 = 2/log2(2) + 1/log2(3) + 1/log2(4)  (ideal: 2, 1, 1) = 2 + 0.63093 + 0.5 = 3.13093
    dcg = 2 / math.log2(3) + 1 / math.log2(5)
    idcg = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at(RANKED, RELS, 10) == pytest.approx(dcg / idcg, rel=1e-12)
    assert ndcg_at(RANKED, RELS, 10) == pytest.approx(0.54059, abs=1e-5)


def test_ndcg_cutoff():
    # @2: DCG = 2/log2(3); IDCG = 2/log2(2) + 1/log2(3) (top two ideal grades 2, 1)
    expected = (2 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert ndcg_at(RANKED, RELS, 2) == pytest.approx(expected, rel=1e-12)
    # @1: d1 is not relevant -> 0
    assert ndcg_at(RANKED, RELS, 1) == 0.0


def test_recall_hand_worked():
    # relevant = {d2, d4, d9} (d7 has grade 0); @5 finds d2, d4 -> 2/3; @2 finds d2 -> 1/3
    assert recall_at(RANKED, RELS, 5) == pytest.approx(2 / 3)
    assert recall_at(RANKED, RELS, 2) == pytest.approx(1 / 3)
    assert recall_at(RANKED, RELS, 1) == 0.0


def test_mrr_hand_worked():
    # first relevant is d2 at rank 2 -> 1/2; cut at 1 -> none -> 0
    assert mrr_at(RANKED, RELS, 10) == 0.5
    assert mrr_at(RANKED, RELS, 1) == 0.0
    assert mrr_at(["d7", "d4"], RELS, 10) == 0.5  # grade 0 is not relevant


def test_perfect_ranking_scores_one():
    ideal = ["d2", "d4", "d9"]
    assert ndcg_at(ideal, RELS, 10) == pytest.approx(1.0)
    assert recall_at(ideal, RELS, 5) == 1.0
    assert mrr_at(ideal, RELS, 10) == 1.0


def test_no_relevant_documents():
    assert ndcg_at(RANKED, {"d1": 0}, 10) == 0.0
    assert recall_at(RANKED, {}, 10) == 0.0
    assert mrr_at(RANKED, {}, 10) == 0.0


def test_evaluate_averages_over_judged_queries_only():
    run = {"q1": RANKED, "q2": ["x", "y"], "q3": ["d2"]}
    qrels = {
        "q1": RELS,
        "q2": {"y": 1},  # y at rank 2: mrr 1/2, recall@5 1
        "q3": {"d2": 0},  # no relevant document: not averaged
        "q4": {"z": 1},  # judged but not in the run: counts as 0
    }
    out = evaluate(run, qrels, ["mrr@10", "recall@5"])
    # mrr:    (1/2 + 1/2 + 0) / 3 ; recall@5: (2/3 + 1 + 0) / 3
    assert out["mrr@10"] == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert out["recall@5"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert evaluate({}, {"q": {"d": 0}}, ["ndcg@10"]) == {"ndcg@10": 0.0}
    assert set(evaluate(run, qrels)) == set(METRICS)


def _random_case(rng, n_queries=8):
    pool = [f"d{i:02d}" for i in range(30)]
    run, qrels = {}, {}
    for q in range(n_queries):
        qid = f"q{q}"
        run[qid] = [pool[i] for i in rng.permutation(len(pool))[: int(rng.integers(1, 20))]]
        judged = rng.permutation(len(pool))[: int(rng.integers(1, 8))]
        grades = {pool[i]: int(rng.integers(0, 4)) for i in judged}
        grades[pool[int(judged[0])]] = int(rng.integers(1, 4))  # at least one relevant
        qrels[qid] = grades
    return run, qrels


def test_metrics_agree_with_ranx_on_random_runs():
    from ranx import Qrels, Run
    from ranx import evaluate as ranx_evaluate

    names = ["ndcg@10", "recall@5", "recall@10", "mrr@10"]
    rng = np.random.default_rng(7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(25):
            run, qrels = _random_case(rng)
            # strictly decreasing scores, so ranx's order is the list order
            ranx_run = Run({q: {d: float(100 - i) for i, d in enumerate(docs)} for q, docs in run.items()})
            theirs = ranx_evaluate(Qrels(qrels), ranx_run, names)
            ours = evaluate(run, qrels, names)
            for name in names:
                assert ours[name] == pytest.approx(float(theirs[name]), rel=1e-9, abs=1e-12), name
