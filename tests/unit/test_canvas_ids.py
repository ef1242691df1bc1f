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
