"""Retrieval metrics are ranx's (one definition for demo, eval and benchmarks):
checked here against hand-worked values."""

from __future__ import annotations

import math

import pytest

from pipeline import evaluation as ev

# One query, hand-worked.
#   ranked: d1 d2 d3 d4            (d2 and d4 relevant, d9 relevant but never retrieved)
#   grades: d2 = 2, d4 = 1, d9 = 1, d7 = 0 (judged not relevant)
RANKED = ["d1", "d2", "d3", "d4"]
RELS = {"d2": 2, "d4": 1, "d9": 1, "d7": 0}


def _one(metric: str, ranked=RANKED, rels=RELS) -> float:
    return ev.score({"q": ranked}, {"q": rels}, [metric])[1]["q"][metric]


def test_ndcg_hand_worked():
    # DCG@10  = 0/log2(2) + 2/log2(3) + 0/log2(4) + 1/log2(5)       = 1.26186 + 0.43068 = 1.69254
    # IDCG@10 = 2/log2(2) + 1/log2(3) + 1/log2(4)  (ideal: 2, 1, 1) = 2 + 0.63093 + 0.5 = 3.13093
    dcg = 2 / math.log2(3) + 1 / math.log2(5)
    idcg = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert _one("ndcg@10") == pytest.approx(dcg / idcg, rel=1e-12)
    assert _one("ndcg@10") == pytest.approx(0.54059, abs=1e-5)
    # @2: DCG = 2/log2(3); IDCG = 2/log2(2) + 1/log2(3); @1: d1 is not relevant -> 0
    assert _one("ndcg@2") == pytest.approx((2 / math.log2(3)) / (2 + 1 / math.log2(3)), rel=1e-12)
    assert _one("ndcg@1") == 0.0


def test_recall_precision_mrr_hand_worked():
    # relevant = {d2, d4, d9} (d7 has grade 0); @5 finds d2, d4 -> 2/3; @2 finds d2 -> 1/3
    assert _one("recall@5") == pytest.approx(2 / 3)
    assert _one("recall@2") == pytest.approx(1 / 3)
    assert _one("recall@1") == 0.0
    assert _one("precision@5") == pytest.approx(2 / 5)  # ranx divides by k, not by the list length
    assert _one("precision@2") == pytest.approx(1 / 2)
    # first relevant is d2 at rank 2 -> 1/2; cut at 1 -> none -> 0; grade 0 is not relevant
    assert _one("mrr@10") == 0.5
    assert _one("mrr@1") == 0.0
    assert _one("mrr@10", ["d7", "d4"]) == 0.5


def test_perfect_ranking_scores_one():
    for metric in ("ndcg@10", "recall@5", "mrr@10"):
        assert _one(metric, ["d2", "d4", "d9"]) == pytest.approx(1.0)


def test_means_over_judged_queries_only():
    run = {"q1": RANKED, "q2": ["x", "y"], "q3": ["d2"]}
    qrels = {
        "q1": RELS,
        "q2": {"y": 1},  # y at rank 2: mrr 1/2, recall@5 1
        "q3": {"d2": 0},  # no relevant document: not averaged
        "q4": {"z": 1},  # judged but not in the run: counts as 0
    }
    means, per_query = ev.score(run, qrels, ["mrr@10", "recall@5"])
    assert means["mrr@10"] == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert means["recall@5"] == pytest.approx((2 / 3 + 1 + 0) / 3)
    assert set(per_query) == {"q1", "q2", "q4"}
    assert ev.score({}, {"q": {"d": 0}}, ["ndcg@10"])[0] == {"ndcg@10": 0.0}
    assert set(ev.score(run, qrels)[0]) == set(ev.METRICS)


def test_tied_scores_keep_the_served_order():
    # the run handed to ranx (and written to run.trec) has rank-derived scores:
    # equal fused scores must not let ranx reorder what was served
    assert _one("mrr@10", ["a", "b", "c"], {"c": 1}) == pytest.approx(1 / 3)
    assert ev.trec_lines({"q": ["b", "a"]}, "r") == ["q Q0 b 1 2 r", "q Q0 a 2 1 r"]


def test_memory_ids_with_spaces_survive_the_written_run_and_qrels(tmp_path):
    run = {"q": ["note 1", "a%b", "tab\tid"]}
    qrels = {"q": {"note 1": 1, "tab\tid": 2}}
    (tmp_path / "run.trec").write_text("\n".join(ev.trec_lines(run, "r")) + "\n", encoding="utf-8")
    (tmp_path / "qrels.trec").write_text("\n".join(ev.qrels_lines(qrels)) + "\n", encoding="utf-8")
    back_run, back_qrels = ev.read_trec_run(tmp_path / "run.trec"), ev.read_qrels(tmp_path / "qrels.trec")
    assert len(back_run["q"]) == 3
    assert ev.score(back_run, back_qrels)[0] == ev.score(run, qrels)[0]


def test_ids_of_any_width_reach_ranx_as_one_width_with_the_same_figures():
    """ranx types a query's memory ids by the longest one and numba compiles
    per type: the ids reach it coded to one width, and the figures do not
    depend on how the ids are spelt."""
    run = {"q1": ["a", "memory-with-a-much-longer-id-0001", "b"], "q2": ["é-ü", "x" * 300, "c"]}
    qrels = {"q1": {"b": 2, "memory-with-a-much-longer-id-0001": 1, "never-retrieved": 1}, "q2": {"x" * 300: 1}}
    codes = ev.metrics.id_codes([run], qrels)
    assert len(set(codes.values())) == len(codes) == 7  # one code per id, none shared
    assert {len(c) for c in codes.values()} == {8}
    means, per_query = ev.score(run, qrels)
    # q1: relevant at ranks 2 and 3 of {b, long, never-retrieved}; q2: its one relevant id at rank 2
    assert per_query["q1"]["recall@5"] == pytest.approx(2 / 3) and per_query["q2"]["recall@5"] == 1.0
    assert means["mrr@10"] == 0.5
    short = {d: f"d{i}" for i, d in enumerate(codes)}
    renamed = ev.score({q: [short[d] for d in ds] for q, ds in run.items()},
                       {q: {short[d]: g for d, g in ds.items()} for q, ds in qrels.items()})
    assert renamed == (means, per_query)
