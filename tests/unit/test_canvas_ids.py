"""A query canvas's task ids derive from its last stage's (the canvas id), so
a stage delivered again after its worker died is not run again once the
query was answered (workers/tasks.py ``already_answered``)."""

from __future__ import annotations

from types import SimpleNamespace
from uuid import uuid4

import pytest

from workers.app import get_app
from workers.canvas import query_canvas
from workers.celery_compat import canvas_ids
from workers.tasks import already_answered

# the process's app is embedded, whatever a test before this one on the same
# xdist worker pointed it at (a broker since torn down)
pytestmark = pytest.mark.usefixtures("embedded")


def test_every_stage_id_derives_from_the_canvas_id():
    result = query_canvas(get_app(), {"states": []}, canvas_id="c1").freeze()
    assert result.id == "c1"
    stages = {i for i in canvas_ids(result) if i.startswith("c1:")}
    assert stages == {f"c1:search.{s}" for s in ("embed", "descend", "fulltext", "fuse", "augment", "scope")}
    assert query_canvas(get_app(), {"states": []}).freeze().id != query_canvas(get_app(), {"states": []}).freeze().id


def test_a_redelivered_stage_of_an_answered_canvas_is_not_run_again():
    answered, pending = str(uuid4()), str(uuid4())
    app = get_app()
    app.backend.store_result(answered, {"states": []}, "SUCCESS")

    def request(task_id: str, redelivered: bool):
        return SimpleNamespace(id=task_id, delivery_info={"redelivered": redelivered, "exchange": ""})

    assert already_answered(app, request(f"{answered}:search.fuse", True))
    assert already_answered(app, request(answered, True))  # the last stage itself
    assert not already_answered(app, request(f"{answered}:search.fuse", False))  # a first delivery always runs
    assert not already_answered(app, request(f"{pending}:search.fuse", True))  # not answered yet: run it
    assert not already_answered(app, None) and not already_answered(app, SimpleNamespace(id=None, delivery_info=None))


@pytest.mark.parametrize("embed", [True, False])
@pytest.mark.parametrize("legs", [("vector", "fts"), ("vector",), ("fts",)])
@pytest.mark.parametrize("expires", [None, "2030-01-01T00:00:00+00:00"])
def test_the_canvas_is_the_one_its_expression_folds_to(embed, legs, expires):
    """``query_canvas`` builds the canvas in the shape Celery folds
    ``chain(chord(group(*legs), fuse), augment, scope, budget)`` to, without
    folding it (~0.2 ms a query): the same message, task for task, for every
    shape a batch can take; with one leg, no chord: ``chain(*leg, fuse,
    augment, scope, budget)``."""
    import json

    from celery import chain, chord, group

    from pipeline.stages.registry import AFTER_FUSION, FULLTEXT_LEG, FUSION, VECTOR_LEG
    from workers.tasks import stage_task_id

    app, batch = get_app(), {"states": []}

    def sig(name, *args):
        options = {"task_id": stage_task_id("c1", name)} | ({"expires": expires} if expires else {})
        return app.tasks[name].s(*args).set(**options)

    def leg(names):
        sigs = [sig(names[0], batch)] + [sig(n) for n in names[1:]]
        return chain(*sigs) if len(sigs) > 1 else sigs[0]

    vector_leg = VECTOR_LEG if embed else VECTOR_LEG[1:]
    header = [leg(names) for name, names in (("vector", vector_leg), ("fts", FULLTEXT_LEG)) if name in legs]
    if len(header) > 1:
        folded = chain(chord(group(*header), sig(FUSION)), *(sig(n) for n in AFTER_FUSION))
    else:
        leg_names = vector_leg if legs == ("vector",) else FULLTEXT_LEG
        folded = chain(*(sig(n, batch) if i == 0 else sig(n) for i, n in enumerate(leg_names)), sig(FUSION),
                       *(sig(n) for n in AFTER_FUSION))

    def as_json(canvas):
        return json.loads(json.dumps(canvas, default=lambda o: dict(o) if isinstance(o, dict) else list(o)))

    built = query_canvas(app, batch, expires, "c1", embed=embed, legs=legs)
    assert as_json(built) == as_json(folded)
    first = as_json(built)["kwargs"]["tasks"][0]
    assert first["subtask_type"] == ("chord" if len(legs) > 1 else None)
    assert first["task"] == ("celery.chord" if len(legs) > 1 else
                                 ("search.embed" if embed else "search.descend") if legs == ("vector",) else
                                 "search.fulltext")
