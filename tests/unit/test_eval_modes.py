"""``dimple eval --mode all``'s paired test of hybrid against each leg, on
constructed runs whose answer is known: identical runs are not different
(p = 1), a run that finds every relevant memory first against one that finds
it tenth is (small p), and the deltas and win counts are hybrid minus leg."""

from __future__ import annotations

import pytest

from pipeline import evaluation as ev
from pipeline.evaluation.report import modes_lines

N = 30  # queries


def _qset() -> ev.QuerySet:
    queries = [ev.QuerySpec(f"q{i}", f"query {i}") for i in range(N)]
    return ev.QuerySet("constructed", queries, {f"q{i}": {f"rel{i}": 1} for i in range(N)})


def _run(name: str, position: dict[str, int | None]) -> tuple[ev.RunReport, dict[str, list[str]]]:
    """Each query answered with 10 memories, its relevant one at ``position[q]`` (None: absent)."""
    qset = _qset()
    runs = []
    for q in qset.queries:
        ranked = [f"other{q.id}-{j}" for j in range(10)]
        at = position.get(q.id)
        if at is not None:
            ranked[at - 1] = "rel" + q.id[1:]
        runs.append(ev.QueryRun(q.id, ranked, [1.0 / (j + 1) for j in range(10)], {}, 1.0, name, store_version=3))
    report = ev.evaluate_run(qset, runs, 1.0, config={}, name=name)
    return report, ev.as_run(runs)


def _legs(positions: dict[str, dict[str, int | None]], **kw):
    made = {mode: _run(mode, pos) for mode, pos in positions.items()}
    return ev.against_legs({m: r for m, (r, _) in made.items()}, {m: run for m, (_, run) in made.items()},
                           _qset().qrels, **kw)


def test_identical_runs_are_not_significantly_different():
    same = {f"q{i}": 1 + i % 7 for i in range(N)}
    summary, full = _legs({"keyword": same, "semantic": same, "hybrid": same})
    assert [t["leg"] for t in summary["tests"]] == ["keyword", "semantic"]
    for t in summary["tests"]:
        assert t["mean_delta"] == 0.0
        assert t["p_value"] == 1.0 and not t["significant"]
        assert t["wins_ties_losses"] == [0, N, 0]
    assert set(full) == {"keyword", "semantic"}
    assert any("not significant" in line for line in modes_lines(summary))


def test_a_clearly_better_hybrid_is_significant_against_the_worse_leg_only():
    first = {f"q{i}": 1 for i in range(N)}
    tenth = {f"q{i}": 10 for i in range(N)}
    summary, _ = _legs({"keyword": tenth, "semantic": first, "hybrid": first}, stat_test="fisher", seed=7)
    keyword, semantic = summary["tests"]
    assert keyword["leg"] == "keyword"
    # nDCG@10 of a single relevant memory at rank 1 is 1, at rank 10 it is 1/log2(11)
    import math

    assert keyword["mean_delta"] == pytest.approx(1 - 1 / math.log2(11), abs=1e-5)
    assert keyword["p_value"] < 0.01 and keyword["significant"]
    assert keyword["wins_ties_losses"] == [N, 0, 0]
    assert semantic["p_value"] == 1.0 and not semantic["significant"]
    assert summary["metrics"]["hybrid"]["ndcg@10"] == pytest.approx(1.0)
    lines = "\n".join(modes_lines(summary))
    assert "hybrid - keyword" in lines and "significantly better" in lines


def test_a_small_mixed_difference_is_not_significant_and_the_student_test_agrees():
    # hybrid gains on 3 queries and loses on 2: a noise-sized difference
    leg = {f"q{i}": 2 for i in range(N)}
    hybrid = dict(leg, q0=1, q1=1, q2=1, q3=3, q4=3)
    for test in ("fisher", "student"):
        summary, _ = _legs({"semantic": leg, "hybrid": hybrid}, stat_test=test)
        (t,) = summary["tests"]
        assert t["wins_ties_losses"] == [3, N - 5, 2]
        assert t["mean_delta"] > 0
        assert t["p_value"] > 0.05 and not t["significant"], test


def test_the_paired_test_needs_a_hybrid_run():
    from pipeline.errors import InputError

    same = {f"q{i}": 1 for i in range(N)}
    with pytest.raises(InputError):
        _legs({"keyword": same, "semantic": same})
