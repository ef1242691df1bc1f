"""A leg no query of a batch wants is not run at all (``Batch.legs``,
``workers.canvas``): a keyword query runs no vector-leg task, a semantic one
no full-text task, and each answers as the canvas of both legs does
(``run_local``); a batch mixing them runs both."""

from __future__ import annotations

import pytest
from celery import signals

from pipeline.contracts import Batch, Results, make_query
from pipeline.stages.registry import run_local
from tests.conftest import write_jsonl
from workers.cli.common import ingest_file


@pytest.fixture
def tasks_run():
    names: list[str] = []

    def seen(task=None, **_):
        names.append(task.name)

    signals.task_prerun.connect(seen, weak=False)
    yield names
    signals.task_prerun.disconnect(seen)


@pytest.mark.parametrize("mode,left_out", [
    ("keyword", {"search.embed", "search.descend"}),
    ("semantic", {"search.fulltext"}),
    ("hybrid", set()),
])
def test_a_leg_that_is_off_runs_no_task_and_the_answer_is_the_same(embedded, tmp_path, tasks_run, mode, left_out):
    from workers import resources
    from workers.api import search

    recs = [{"id": f"m{i}", "namespace": "a", "content": f"note {i} on the deploy window and redis host db-{i % 4}",
             **({"supersedes": [f"m{i - 1}"]} if i % 5 == 4 else {})} for i in range(20)]
    ingest_file(write_jsonl(tmp_path / "m.jsonl", recs), embedded, progress=False)
    options = {"mode": mode, "now": "2026-01-01T00:00:00"}
    found = search("deploy window db-2", **options)
    ran = set(tasks_run)
    assert not ran & left_out
    assert {"search.fuse", "search.augment", "search.scope", "search.budget"} <= ran
    both = run_local(Batch(states=[{"query": make_query("deploy window db-2", options, embedded)}]), resources.current())
    local = Results.from_state(both.states[0])
    assert found.results and [r.model_dump() for r in found.results] == [r.model_dump() for r in local.results]
    assert (found.mode, list(found.legs)) == (local.mode, list(local.legs))  # the legs in the same order
    timed = {k: {**v, **({"ms": found.legs[k]["ms"]} if "ms" in v else {})} for k, v in local.legs.items()}
    assert found.legs == timed  # the leg left out recorded as the canvas of both legs records it


def test_a_batch_mixing_modes_runs_both_legs(embedded, tmp_path, tasks_run):
    from workers.api import search_many

    ingest_file(write_jsonl(tmp_path / "m.jsonl", [{"id": "m", "namespace": "a", "content": "the deploy window"}]),
                embedded, progress=False)
    keyword, semantic = search_many([{"query": "deploy", "mode": "keyword"}, {"query": "deploy", "mode": "semantic"}],
                                    batch_size=2)
    assert {"search.descend", "search.fulltext"} <= set(tasks_run)
    assert (keyword.mode, semantic.mode) == ("keyword", "semantic")
