"""A stage task that receives a malformed message fails with a ``StageError``
naming the stage and the field, before it touches any resource; the in-process
runner runs the declared stages in the canvas's shape."""

from __future__ import annotations

import pytest

from pipeline.contracts import Batch, make_query
from pipeline.errors import InputError, StageError
from pipeline.stages.registry import AFTER_FUSION, FULLTEXT_LEG, FUSION, STAGES, VECTOR_LEG
from workers.app import get_app

STAGE_TASKS = {name: get_app().tasks[name] for name in STAGES}


def test_every_declared_stage_is_a_registered_task():
    assert set(STAGE_TASKS) == set(STAGES)
    assert [*VECTOR_LEG, *FULLTEXT_LEG, FUSION, *AFTER_FUSION] == list(STAGES)
    for name, task in STAGE_TASKS.items():
        assert task.name == name


@pytest.mark.parametrize("name", sorted(n for n in STAGES if not STAGES[n].fan_in))
@pytest.mark.parametrize("payload,field", [
    ({"states": [{"query": {"text": 5}}]}, "states.0.query.text"),
    ({"states": "nope"}, "states"),
    ({"states": [], "extra": 1}, "extra"),
    ([1, 2, 3], ""),
    (None, ""),
])
def test_a_malformed_batch_is_a_stage_error_naming_stage_and_field(name, payload, field):
    with pytest.raises(StageError) as err:
        STAGE_TASKS[name](payload)
    assert str(err.value).startswith(f"{name} got a malformed")
    assert field in str(err.value)


@pytest.mark.parametrize("payload", ["legs", None, [{"states": [{"query": {}}]}], {"states": [{"query": {}}]}])
def test_fusion_wants_leg_batches(payload):
    with pytest.raises(StageError, match="search.fuse got a malformed"):
        STAGE_TASKS[FUSION](payload)


def test_fusion_takes_a_lone_legs_batch_as_the_list_of_that_one(embedded):
    """A one-leg canvas is a chain (workers.canvas): fusion gets the leg's
    batch itself, and answers as the chord's list of one would have it."""
    def fused(payload) -> dict:
        out = STAGE_TASKS[FUSION](payload)
        for state in out["states"]:
            assert state["timings"].pop("fuse") >= 0  # the one thing that differs: how long it took
        return out

    leg = STAGE_TASKS["search.fulltext"](_message(embedded))
    assert leg["states"][0]["legs"]["fts"]["ran"]
    assert fused(leg) == fused([leg])
    assert STAGE_TASKS[FUSION]({"states": []}) == {"states": []}  # no queries: nothing to fuse, no error


def test_a_well_formed_batch_goes_through_json_unchanged_in_shape(settings):
    batch = Batch(states=[{"query": make_query("deploy window", {"mode": "keyword"}, settings)}])
    again = Batch.model_validate_json(batch.model_dump_json())
    assert again == batch and again.states[0].query.scope == batch.states[0].query.scope


def _message(settings, **query_changes) -> dict:
    query = make_query("deploy window", {"mode": "keyword"}, settings).model_dump(mode="json")
    return {"states": [{"query": {**query, **query_changes}}]}


@pytest.mark.parametrize("changes,error,field", [
    ({"text": "a\x00b"}, StageError, "states.0.query.text"),
    ({"text": "   "}, InputError, "query: must not be empty"),
    ({"top_k": -5}, StageError, "states.0.query.top_k"),
    ({"top_k": 10**9}, InputError, "top_k: 1000000000 is over the limit"),
    ({"budget": {"max_units": 0}}, StageError, "states.0.query.budget.max_units"),
    ({"budget": {"max_ms": 10**9}}, InputError, "max_ms: 1000000000 is over the limit"),
    ({"scope": {"namespace": "a\x00"}}, StageError, "states.0.query.scope.namespace"),
    ({"scope": {"topics": ["t"] * 300}}, InputError, "topics: more than 256 values"),
])
def test_a_stage_rechecks_the_apis_rules_on_every_message(embedded, changes, error, field):
    """A query that did not come through the API (a raw message on the queue)
    meets the same limits and the same errors as one that did."""
    for name in ("search.embed", "search.fulltext", "search.scope"):
        with pytest.raises(error) as err:
            STAGE_TASKS[name](_message(embedded, **changes))
        assert field in str(err.value)
