"""The typed query state: ``make_query`` resolution and validation, JSON
round-trips, and the mode a state reports."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipeline.contracts import (
    Batch,
    Budget,
    Fused,
    GraphLink,
    Hit,
    LegRun,
    Mode,
    Query,
    QueryOptions,
    QueryState,
    Result,
    Results,
    Truncation,
    make_query,
)
from pipeline.errors import InputError
from pipeline.settings import Settings

_PLAIN = Settings(embedding_model="hash-64", _env_file=None)  # for hypothesis (no fixtures)


# -- modes and weights --------------------------------------------------------------
def test_keyword_mode_is_pure_fulltext(settings):
    q = make_query("deploy window", {"mode": "keyword"}, settings)
    assert q.weights == {"vector": 0.0, "fts": 1.0}
    assert q.wants("fts") and not q.wants("vector")


def test_semantic_mode_is_pure_vector(settings):
    q = make_query("deploy window", {"mode": "semantic"}, settings)
    assert q.weights == {"vector": 1.0, "fts": 0.0}
    assert q.wants("vector") and not q.wants("fts")


def test_hybrid_mode_takes_the_weights_from_settings(settings):
    convex = settings.model_copy(update={"convex_alpha": 0.3})
    assert make_query("x", None, convex).weights == {"vector": 0.3, "fts": pytest.approx(0.7)}  # convex_alpha
    s = settings.model_copy(update={"fusion": "rrf", "vector_weight": 0.3, "fts_weight": 2.5})
    assert make_query("x", {"mode": "hybrid"}, s).weights == {"vector": 0.3, "fts": 2.5}
    assert make_query("x", None, s).weights == {"vector": 0.3, "fts": 2.5}  # hybrid is the default


def test_explicit_weights_override_the_mode(settings):
    q = make_query("x", {"mode": "keyword", "weights": {"vector": 0.5, "fts": 2}}, settings)
    assert q.weights == {"vector": 0.5, "fts": 2.0}


def test_mode_given_as_enum_or_options_object(settings):
    assert make_query("x", QueryOptions(mode=Mode.semantic), settings).weights == {"vector": 1.0, "fts": 0.0}
    assert make_query("x", {"mode": Mode.keyword}, settings).weights == {"vector": 0.0, "fts": 1.0}


def test_unknown_mode_names_the_field_and_the_valid_values(settings):
    with pytest.raises(InputError) as info:
        make_query("x", {"mode": "fuzzy"}, settings)
    assert info.value.field == "mode"
    for valid in ("keyword", "semantic", "hybrid"):
        assert valid in info.value.reason
    assert "fuzzy" in info.value.reason


def test_mode_parse_raises_input_error():
    assert Mode.parse("keyword") is Mode.keyword
    with pytest.raises(InputError) as info:
        Mode.parse("loud")
    assert info.value.field == "mode" and "hybrid" in info.value.reason


# -- budgets and top-k ----------------------------------------------------------------
def test_budgets_and_top_k_default_from_settings(settings):
    s = settings.model_copy(update={
        "budget": settings.budget.model_copy(update={"max_units": 7, "max_chars": 900, "max_ms": 250}),
        "leg_top_k": 33,
    })
    q = make_query("x", None, s)
    assert (q.budget.max_units, q.budget.max_chars, q.budget.max_ms, q.top_k) == (7, 900, 250, 33)
    q = make_query("x", {"max_units": 2, "max_chars": 50, "max_ms": 10, "top_k": 5}, s)
    assert (q.budget.max_units, q.budget.max_chars, q.budget.max_ms, q.top_k) == (2, 50, 10, 5)


@pytest.mark.parametrize(
    "field,value",
    [(f, v) for f in ("max_units", "max_chars", "max_ms", "top_k") for v in (-1, 0)]
    + [("recency_boost", -0.5)],  # a zero boost is valid: no boost
)
def test_negative_or_zero_budget_names_the_field(settings, field, value):
    with pytest.raises(InputError) as info:
        make_query("x", {field: value}, settings)
    assert info.value.field == field


def test_bad_nested_weight_names_the_path(settings):
    with pytest.raises(InputError) as info:
        make_query("x", {"weights": {"vector": -1}}, settings)
    assert info.value.field == "weights.vector"


def test_unknown_option_is_named(settings):
    with pytest.raises(InputError) as info:
        make_query("x", {"colour": "red"}, settings)
    assert info.value.field == "colour"
    assert info.value.reason == "unknown option"


# -- query text -------------------------------------------------------------------
def test_query_over_the_length_limit(settings):
    limit = settings.limits.max_query_chars
    make_query("q" * limit, None, settings)  # at the limit: fine
    with pytest.raises(InputError) as info:
        make_query("q" * (limit + 1), None, settings)
    assert info.value.field == "query"
    assert str(limit) in info.value.reason


def test_query_must_be_a_string_without_nul(settings):
    for bad in (None, 42, ["x"]):
        with pytest.raises(InputError) as info:
            make_query(bad, None, settings)
        assert info.value.field == "query"
    with pytest.raises(InputError) as info:
        make_query("a\x00b", None, settings)
    assert info.value.field == "query"
    for blank in ("", "   ", "\n\t"):
        with pytest.raises(InputError) as info:
            make_query(blank, None, settings)
        assert info.value.field == "query"


def test_too_many_filter_values(settings):
    s = settings.model_copy(update={"limits": settings.limits.model_copy(update={"max_filter_values": 2})})
    with pytest.raises(InputError) as info:
        make_query("x", {"topics": ["a", "b", "c"]}, s)
    assert info.value.field == "topics"


# -- content_type and filters -----------------------------------------------------
def test_content_type_as_a_string_or_a_list(settings):
    assert make_query("x", {"content_type": "code"}, settings).options.content_type == ["code"]
    assert make_query("x", {"content_type": ["text", "code", "text"]}, settings).options.content_type == ["code", "text"]
    assert make_query("x", {"content_type": None}, settings).options.content_type == []
    assert make_query("x", {}, settings).options.content_type == []


def test_empty_filter_entry_is_refused(settings):
    with pytest.raises(InputError) as info:
        make_query("x", {"concepts": [""]}, settings)
    assert info.value.field == "concepts"


def test_timezone_aware_now_becomes_naive_utc(settings):
    q = make_query("x", {"now": "2025-03-01T12:00:00+02:00"}, settings)
    assert q.options.now == datetime(2025, 3, 1, 10, 0, 0)


# -- JSON round trips -------------------------------------------------------------------
def _full_state(settings) -> QueryState:
    q = make_query(
        "deploy window",
        {"namespace": "ops", "topics": ["t1"], "content_type": "code", "concepts": ["c"],
         "recency_boost": 0.5, "now": "2025-01-02T03:04:05Z", "max_chars": 500},
        settings,
    )
    q.vector = [0.1, -0.25, 1e-7]
    link = GraphLink(id="m9", preview="old", namespace="ops", content_type="code", topics=["t1"], concepts=["c"])
    result = Result(
        rank=1, id="m1", score=0.03, rrf=0.02, recency_factor=0.5, ranks={"vector": 1, "fts": 3},
        namespace="ops", content_type="code", created_at=datetime(2024, 12, 31, 23, 59, 59, 123456),
        content="the deploy window is Tuesday", preview="the deploy window…", topics=["t1"], concepts=["c"],
        superseded_by=[link], conflicts=[link], supported_by=[],
    )
    return QueryState(
        query=q,
        legs={
            "vector": LegRun(leg="vector", ran=True, hits=[Hit(id="m1", score=0.9, rank=1)],
                             profile={"reached": ["a-1"], "timed_out": False, "ms": 0.5}),
            "fts": LegRun(leg="fts", ran=False, profile={"timed_out": True}),
        },
        fused=[Fused(id="m1", rrf=1 / 61, score=1 / 61 * 1.25, recency_factor=0.5, ranks={"vector": 1})],
        results=[result],
        truncated=True,
        truncation=Truncation(by="maxMs", left_out=0, limit=5, detail="deadline"),
        timings={"embed": 1.25},
        scope_dropped=2,
    )


def test_batch_round_trips_through_json(settings):
    b = Batch(states=[_full_state(settings), QueryState(query=make_query("y", None, settings))])
    assert Batch.model_validate_json(b.model_dump_json()) == b
    # the Celery wire: dict of JSON types, through json.dumps/loads
    wire = json.loads(json.dumps(b.model_dump(mode="json")))
    assert Batch.model_validate(wire) == b


def test_results_round_trip_through_json(settings):
    r = Results.from_state(_full_state(settings))
    assert Results.model_validate_json(r.model_dump_json()) == r
    assert r.requested_mode is Mode.hybrid and r.mode == "semantic"
    assert r.legs["vector"]["hits"] == 1 and r.legs["fts"]["ran"] is False


@hsettings(max_examples=100, deadline=None)
@given(
    scores=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=5),
    text=st.text(min_size=1, max_size=30).filter(lambda t: "\x00" not in t and t.strip()),
    when=st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1)),
)
def test_any_state_round_trips(scores, text, when):
    q = make_query(text, {"now": when}, _PLAIN)
    state = QueryState(
        query=q,
        legs={"fts": LegRun(leg="fts", ran=True, hits=[Hit(id=f"m{i}", score=s, rank=i + 1) for i, s in enumerate(scores)])},
        fused=[Fused(id=f"m{i}", rrf=s, score=s) for i, s in enumerate(scores)],
    )
    b = Batch(states=[state])
    assert Batch.model_validate_json(b.model_dump_json()) == b


def test_extra_fields_are_refused_on_the_wire(settings):
    data = Batch(states=[QueryState(query=make_query("x", None, settings))]).model_dump(mode="json")
    data["states"][0]["surprise"] = 1
    with pytest.raises(ValueError):
        Batch.model_validate(data)


# -- QueryState.mode ------------------------------------------------------------------
@pytest.mark.parametrize(
    "ran,mode",
    [
        ({"vector": True, "fts": True}, "hybrid"),
        ({"vector": False, "fts": True}, "keyword"),
        ({"vector": True, "fts": False}, "semantic"),
        ({"vector": False, "fts": False}, "none"),
        ({}, "none"),
        ({"fts": True}, "keyword"),
    ],
)
def test_state_mode_reflects_the_legs_that_ran(settings, ran, mode):
    state = QueryState(query=make_query("x", None, settings),
                       legs={name: LegRun(leg=name, ran=r) for name, r in ran.items()})
    assert state.mode == mode


def test_hybrid_request_whose_vector_leg_timed_out_reports_keyword(settings):
    state = QueryState(
        query=make_query("x", {"mode": "hybrid"}, settings),
        legs={"vector": LegRun(leg="vector", ran=False, profile={"timed_out": True}),
              "fts": LegRun(leg="fts", ran=True)},
    )
    r = Results.from_state(state)
    assert (r.requested_mode, r.mode) == (Mode.hybrid, "keyword")


def test_query_deadline(settings):
    q = Query(text="x", started_at=1000.0, budget=Budget(max_ms=250))
    assert q.deadline == 1000.25
    assert not q.past_deadline(1000.2) and q.past_deadline(1000.25)
    assert Query(text="x").deadline is None and not Query(text="x").past_deadline()


@pytest.mark.parametrize("text,expected", [("0.5:1", (0.5, 1.0)), ("0:2", (0.0, 2.0)), ("1e-3:0", (0.001, 0.0))])
def test_leg_weights_parse(text, expected):
    from pipeline.contracts import parse_leg_weights

    assert parse_leg_weights(text) == expected


@pytest.mark.parametrize("text", ["1", "1:2:3", "a:1", "-1:1", "0:0", "nan:1", "inf:1", ""])
def test_bad_leg_weights_name_the_field(text):
    from pipeline.contracts import parse_leg_weights
    from pipeline.evaluation import parse_weights

    with pytest.raises(InputError) as err:
        parse_leg_weights(text, "--weights")
    assert err.value.field == "--weights"
    with pytest.raises(InputError):  # the sweep's comma list takes the same form
        parse_weights(f"1:1,{text}")
