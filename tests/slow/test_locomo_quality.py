"""LoCoMo quality through the real embedded pipeline (slow tier; needs
../shared/data). Default settings (RRF with per-query leg weights, BM25
k1 0.6, near-equal full-text scores sharing a rank, full-text hits under
half the best not counted, a query's stopwords dropped before stemming,
issue 16): hybrid nDCG@10 >= 0.50, the issue's goal, and R@10 >= 0.675
(measured 0.5045 / 0.6790; without the full-text floor 0.5003 / 0.6745, p =
0.025 on nDCG@10; with the query's stopword stems still matching: 0.5004 /
0.6761; without the tie rule 0.492 / 0.676; k1 1.2 before: 0.487 / 0.667;
the fixed 0.4:1 weights before that: 0.474 / 0.658), above both legs.
``fusion=convex`` (alpha 0.4) reaches the issue's 0.50 / 0.69 (BENCHMARKS.md,
"Fusion defaults", second to fourth rounds)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_hybrid_meets_the_goal_and_beats_both_legs(locomo_embedded_run):
    figures = {}
    for mode in ("keyword", "semantic", "hybrid"):
        report, _ = locomo_embedded_run(mode)
        assert report["answered"] == 1536
        figures[mode] = report["metrics"]
    print("\n" + "\n".join(f"{m}: nDCG@10 {f['ndcg@10']:.4f} R@10 {f['recall@10']:.4f}" for m, f in figures.items()))
    hybrid = figures["hybrid"]
    assert hybrid["ndcg@10"] >= 0.50 and hybrid["recall@10"] >= 0.675
    for leg in ("keyword", "semantic"):
        assert hybrid["ndcg@10"] > figures[leg]["ndcg@10"], leg
        assert hybrid["recall@10"] > figures[leg]["recall@10"], leg


def test_convex_fusion_reaches_the_issue_goal_above_both_legs(locomo_embedded_run):
    report, _ = locomo_embedded_run("hybrid", "convex")
    assert report["answered"] == 1536
    convex = report["metrics"]
    print(f"\nconvex: nDCG@10 {convex['ndcg@10']:.4f} R@10 {convex['recall@10']:.4f}")
    assert convex["ndcg@10"] >= 0.50 and convex["recall@10"] >= 0.69
    for leg in ("keyword", "semantic"):
        assert convex["ndcg@10"] > locomo_embedded_run(leg)[0]["metrics"]["ndcg@10"], leg
