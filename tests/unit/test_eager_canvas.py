"""Embedded, the query canvas runs in this process through ``run_eager``:
every stage a Celery task run by Celery's tracer, with what ``apply()`` gives
it, and the answer, failures included, the one ``canvas.apply().get()`` gives,
although each stage hands its batch to the next as it is (``HandedOn``), where
under ``apply()`` it goes as JSON that the next stage validates again."""

from __future__ import annotations

import json

import pytest
from celery import signals

from pipeline.errors import StageError
from workers import api
from workers.app import get_app
from workers.canvas import query_canvas, run_eager
from workers.tasks import HandedOn

MEMORIES = [
    {"id": f"m{i}", "content": text, "namespace": "ops", "topics": ["deploys"]}
    for i, text in enumerate([
        "the deploy window moved to thursday night",
        "rollback the payments service when error rates pass two percent",
        "the staging cluster runs on three nodes",
        "deploys freeze during the quarterly audit",
    ])
]


def _timeless(value):
    """``value`` without the time each stage took (the one thing two runs of
    the same canvas do not share)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k not in ("timings", "ms") and not k.endswith("_ms")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _json(handed: HandedOn) -> dict:
    """What the canvas's last stage handed on, as the JSON it sends on workers."""
    assert isinstance(handed, HandedOn)
    return handed.batch.model_dump(mode="json")


def _batch(mode: str, **options) -> tuple[dict, bool, tuple]:
    model = api._batch([("when is the deploy window", {"mode": mode, **options})])
    return model.model_dump(mode="json"), model.needs_embedding(), model.legs()


# beside MEMORIES: every kind of link, a supersession chain, two namespaces and types,
# so that the answers compared carry graph context, promotions and budgets
LINKED = [
    {"id": f"n{i}", "namespace": "ops" if i % 3 else "notes", "content_type": "code" if i % 2 else "text",
     "topics": ["deploys", f"t{i % 4}"], "concepts": [f"c{i % 3}"],
     "content": f"deploy window note {i}: the window is {['thursday', 'friday', 'monday'][i % 3]} night, "
                f"host db-{i % 5}",
     **({"supersedes": [f"n{i - 1}"]} if i % 6 == 5 else {}),
     **({"conflicts": [f"n{i - 2}"]} if i % 7 == 3 else {}),
     **({"supported_by": [f"n{i - 3}"]} if i % 5 == 4 else {})}
    for i in range(30)
]


@pytest.fixture
def store(embedded):
    api.remember(MEMORIES)
    return embedded


@pytest.fixture
def linked(store):
    api.remember(LINKED)
    return store


@pytest.mark.parametrize("mode,options", [
    ("keyword", {}), ("semantic", {}), ("hybrid", {}),
    ("hybrid", {"max_units": 3, "namespace": "ops"}), ("keyword", {"max_chars": 120, "content_type": "code"}),
    ("hybrid", {"supersession": "hide", "concepts": ["c1"]}), ("keyword", {"supersession": "annotate"}),
])
def test_the_answer_is_the_one_celerys_apply_gives(linked, mode, options):
    app = get_app()
    batch, embed, legs = _batch(mode, **options)
    applied = query_canvas(app, batch, canvas_id="a", embed=embed, legs=legs).apply().get()
    ran = _json(run_eager(app, query_canvas(app, batch, canvas_id="b", embed=embed, legs=legs)))
    assert ran["states"][0]["results"], "the query found nothing: the comparison would prove little"
    if not options:  # graph context among the answers compared
        assert any(r["superseded_by"] or r["conflicts"] or r["supported_by"] for r in ran["states"][0]["results"])
    assert _timeless(ran) == _timeless(applied)
    # and again, with every tracer already built
    again = _json(run_eager(app, query_canvas(app, batch, canvas_id="c", embed=embed, legs=legs)))
    assert _timeless(again) == _timeless(applied)


@pytest.mark.parametrize("mode,stages", [
    ("keyword", ["fulltext", "fuse", "augment", "scope", "budget"]),
    ("hybrid", ["embed", "descend", "fulltext", "fuse", "augment", "scope", "budget"]),
])
def test_every_stage_runs_as_its_task_with_the_canvas_ids(store, mode, stages):
    """Celery's task signals fire for each stage, in the canvas's order, with
    the stage's task id and its request marked eager, as under ``apply()``."""
    seen = []

    def prerun(task_id=None, task=None, **_):
        seen.append((task.name, task_id, task.request.is_eager, task.request.id))

    signals.task_prerun.connect(prerun, weak=False)
    try:
        batch, embed, legs = _batch(mode)
        run_eager(get_app(), query_canvas(get_app(), batch, canvas_id="q1", embed=embed, legs=legs))
    finally:
        signals.task_prerun.disconnect(prerun)
    assert [name for name, *_ in seen] == [f"search.{s}" for s in stages]
    for name, task_id, eager, request_id in seen:
        assert eager is True and request_id == task_id
        assert task_id == ("q1" if name == "search.budget" else f"q1:{name}")


def test_a_stages_error_is_raised_as_apply_raises_it(store):
    """A malformed message fails in its stage with the same ``StageError``
    either way, and nothing after that stage runs."""
    app = get_app()
    bad = {"states": [{"query": {"text": 5}}]}
    with pytest.raises(StageError) as applied:
        query_canvas(app, bad, embed=False, legs=("fts",)).apply()
    ran = []

    def prerun(task=None, **_):
        ran.append(task.name)

    signals.task_prerun.connect(prerun, weak=False)
    try:
        with pytest.raises(StageError) as eager:
            run_eager(app, query_canvas(app, bad, embed=False, legs=("fts",)))
    finally:
        signals.task_prerun.disconnect(prerun)
    assert str(eager.value) == str(applied.value)
    assert ran == ["search.fulltext"]


def test_an_embedded_search_answers_under_its_canvas_id(store):
    handle = api.search_async("deploy window", mode="keyword")
    assert handle.state == "SUCCESS" and handle.ready()
    results = handle.get()
    assert results.results and results.results[0].id == "m0"
    # Celery's own attributes give the answer's JSON, as a handle of a query on workers does
    assert handle.result == handle.info == handle._get_task_meta()["result"]
    assert json.loads(json.dumps(handle.result))["states"][0]["results"][0]["id"] == "m0"
    assert handle.id and handle.id != api.search_async("deploy window", mode="keyword").id


def test_anything_but_a_canvas_is_refused(store):
    with pytest.raises(TypeError, match="not a canvas"):
        run_eager(get_app(), {"states": []})
