"""Retrieval metrics and paired tests (one definition for demo, eval and
benchmarks): checked here against hand-worked values and against ranx, the
reference library whose definitions they follow."""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest

from pipeline import evaluation as ev
from pipeline.errors import InputError

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
    assert _one("precision@5") == pytest.approx(2 / 5)  # over k, not over the list's length (as ranx)
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
    # the metrics read the served order; the run written to run.trec has
    # rank-derived scores, so equal fused scores cannot reorder it for a tool
    # that sorts by score
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


def test_a_memory_listed_twice_counts_at_its_first_rank():
    assert _one("mrr@10", ["d1", "d2", "d2"]) == 0.5
    assert _one("precision@5", ["d2", "d2", "d4"]) == pytest.approx(2 / 5)


def test_an_unknown_metric_is_a_typed_error_naming_it():
    with pytest.raises(InputError, match="'ndcg10'") as err:
        ev.score({"q": RANKED}, {"q": RELS}, ["ndcg10"])
    assert err.value.field == "metrics"
    for bad in ("map@10", "ndcg@0", "recall@x"):
        with pytest.raises(InputError):
            ev.score({"q": RANKED}, {"q": RELS}, [bad])


# -- against ranx ----------------------------------------------------------------------------------
def _random_sets(seed: int, queries: int = 60, pool: int = 40):
    """Runs and graded judgments of every shape the metrics meet: lists
    shorter and longer than k, no relevant memory retrieved, grades 0-3,
    relevant memories never retrieved, ids of different widths."""
    rng = random.Random(seed)
    ids = [f"m{i}" + "x" * rng.randrange(0, 12) for i in range(pool)]
    run, qrels = {}, {}
    for q in range(queries):
        run[f"q{q}"] = rng.sample(ids, rng.randrange(1, pool))
        judged = rng.sample(ids, rng.randrange(1, 8))
        qrels[f"q{q}"] = {d: rng.choice((0, 1, 1, 2, 3)) for d in judged}
    qrels["unanswered"] = {ids[0]: 2}
    return run, qrels


def _ranx(run, qrels):
    from ranx import Qrels, Run

    return (Run({q: {d: float(len(docs) - i) for i, d in enumerate(docs)} for q, docs in run.items()}),
            Qrels({q: dict(docs) for q, docs in qrels.items()}))


METRICS_AT_OTHER_K = ("ndcg@1", "ndcg@3", "ndcg@100", "recall@1", "recall@20", "mrr@3", "precision@1", "precision@50")


@pytest.mark.slow  # ranx compiles its functions on first call, per id width: 20-45 s on a fresh install
def test_every_metric_matches_ranx_per_query():
    from ranx import evaluate

    run, qrels = _random_sets(seed=7)
    names = list(ev.METRICS) + list(METRICS_AT_OTHER_K)
    means, per_query = ev.score(run, qrels, names)
    relevant = {q for q, docs in qrels.items() if any(g >= 1 for g in docs.values())}
    assert set(per_query) == relevant and "unanswered" in relevant
    reference, truth = _ranx({q: run.get(q, []) for q in relevant if run.get(q)}, {q: qrels[q] for q in relevant})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        evaluate(truth, reference, names, save_results_in_run=True, make_comparable=True)
    for m in names:
        for q in relevant:
            assert per_query[q][m] == pytest.approx(reference.scores[m].get(q, 0.0), abs=1e-12), (m, q)
        assert means[m] == pytest.approx(np.mean([reference.scores[m].get(q, 0.0) for q in relevant]), abs=1e-12)


def _paired(seed: int, queries: int = 120, shift: float = 0.0):
    rng = np.random.default_rng(seed)
    control = rng.random(queries)
    treatment = np.clip(control + rng.normal(shift, 0.15, queries), 0, 1)
    return control, treatment


@pytest.mark.slow  # ranx compiles its functions on first call, per id width: 20-45 s on a fresh install
@pytest.mark.parametrize("shift", [0.0, 0.015, 0.03])
def test_the_randomisation_test_agrees_with_ranx(shift):
    """The same test as ranx's, so p estimates the same probability: at 20,000
    permutations each side's estimate is within about 0.0035 (one sd)."""
    from ranx.statistical_tests import fisher_randomization_test

    control, treatment = _paired(seed=3, shift=shift)
    ours = ev.paired_p_value(control, treatment, stat_test="fisher", permutations=20_000, seed=1)
    theirs, _ = fisher_randomization_test(control, treatment, 20_000, 0.05, 1)
    assert ours == pytest.approx(theirs, abs=0.02)


@pytest.mark.slow  # ranx compiles its functions on first call, per id width: 20-45 s on a fresh install
def test_the_t_test_is_ranx_s():
    from ranx.statistical_tests import paired_student_t_test

    control, treatment = _paired(seed=4, shift=0.03)
    assert ev.paired_p_value(control, treatment, stat_test="student") == pytest.approx(
        paired_student_t_test(control, treatment)[0], rel=1e-12)


def test_the_randomisation_test_is_reproducible_for_a_seed_and_tells_a_difference():
    control, treatment = _paired(seed=5, shift=0.06)
    p = ev.paired_p_value(control, treatment, seed=42)
    assert p == ev.paired_p_value(list(control), list(treatment), seed=42)
    assert p < 0.01  # a shift of 0.06 over 120 queries (sd 0.15): z about 4
    assert ev.paired_p_value(control, control + 0.0) == 1.0
    assert ev.paired_p_value(control, control, stat_test="student") == 1.0
    assert ev.paired_p_value(treatment, control, seed=42) == p  # two-sided
    with pytest.raises(InputError) as err:
        ev.paired_p_value(control, treatment, stat_test="tukey")
    assert err.value.field == "stat_test"
