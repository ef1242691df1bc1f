"""``dimple tune``'s cross-validation on constructed runs whose answer is
known (``pipeline.evaluation.tune``): the folds, the choice per fold, the
held-out gain against the current settings and its paired test."""

from __future__ import annotations

import math

import pytest

from pipeline.errors import InputError
from pipeline.evaluation import QuerySet, QuerySpec
from pipeline.evaluation.tune import GRID, FusionConfig, check_queries, cross_validate, deal

IDS = [f"q{i}" for i in range(23)]
QRELS = {q: {f"rel-{q}": 1} for q in IDS}
CURRENT, LOW, RRF = FusionConfig("convex", convex_alpha=0.5), FusionConfig("convex", convex_alpha=0.2), FusionConfig("rrf", rrf_k=60)


def _run(rank_of: dict[str, int]) -> dict[str, list[str]]:
    """Each query's relevant memory at ``rank_of[q]`` among ten."""
    out = {}
    for q in IDS:
        ranked = [f"x-{q}-{j}" for j in range(10)]
        ranked[rank_of[q] - 1] = f"rel-{q}"
        out[q] = ranked
    return out


def test_the_grid_is_the_stated_one():
    assert [c.name for c in GRID] == [f"convex alpha={a / 10:g}" for a in range(1, 10)] + ["rrf k=10", "rrf k=60"]


def test_folds_cover_every_query_once_evenly_and_reproducibly():
    folds = deal(IDS, 5, seed=42)
    assert sorted(q for f in folds for q in f) == sorted(IDS)
    assert sorted(len(f) for f in folds) == [4, 4, 5, 5, 5]
    assert folds == deal(IDS, 5, seed=42) and folds != deal(IDS, 5, seed=7)


def test_a_configuration_better_on_every_query_is_chosen_in_every_fold_with_its_gain():
    runs = {CURRENT: _run({q: 3 for q in IDS}), LOW: _run({q: 1 for q in IDS}), RRF: _run({q: 2 for q in IDS})}
    r = cross_validate(runs, CURRENT, IDS, QRELS, k=5, seed=42)
    assert [f.chosen for f in r.folds] == [LOW] * 5 and r.chosen == LOW
    assert r.held_out_mean == pytest.approx(1.0) and r.current_mean == pytest.approx(1 / math.log2(4))
    assert r.gain == pytest.approx(1 - 1 / math.log2(4))
    assert r.p_value < 0.01 and r.significant()
    assert r.evidence()["per_fold"][0]["chosen"] == "convex alpha=0.2"


def test_ties_keep_the_current_settings_and_no_gain_is_not_significant():
    same = _run({q: 1 + i % 4 for i, q in enumerate(IDS)})
    r = cross_validate({LOW: same, CURRENT: same, RRF: same}, CURRENT, IDS, QRELS)
    assert r.chosen == CURRENT and all(f.chosen == CURRENT for f in r.folds)
    assert r.gain == 0 and r.p_value == 1.0 and not r.significant()


def test_a_choice_that_only_fits_its_training_folds_shows_no_held_out_gain():
    # LOW wins big on the first 3 queries and loses a little on every other: chosen where those 3 are
    # in training, never better where held out; the current settings are the honest answer
    better = {q: (1 if i < 3 else 4) for i, q in enumerate(IDS)}
    runs = {CURRENT: _run({q: 3 for q in IDS}), LOW: _run(better)}
    r = cross_validate(runs, CURRENT, IDS, QRELS)
    assert r.gain <= 0 and not r.significant()


def test_fewer_than_twenty_judged_queries_or_bad_folds_are_refused_naming_the_field():
    qset = QuerySet("s", [QuerySpec(f"q{i}", "t") for i in range(25)],
                    {f"q{i}": {"m": 1 if i < 19 else 0} for i in range(25)})
    with pytest.raises(InputError) as exc:
        check_queries(qset, 5)
    assert exc.value.field == "QUERIES" and "19 judged queries" in exc.value.reason
    ok = QuerySet("s", qset.queries, {f"q{i}": {"m": 1} for i in range(25)})
    assert len(check_queries(ok, 5)) == 25
    for folds in (1, 26):
        with pytest.raises(InputError) as exc:
            check_queries(ok, folds)
        assert exc.value.field == "--folds"
