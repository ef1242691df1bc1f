"""The Python API in embedded mode: edge cases a caller hits, and maxMs."""

from __future__ import annotations

import time

import pytest

from pipeline.errors import InputError
from tests.conftest import write_jsonl
from workers.cli.common import ingest_file


def _store(settings, tmp_path, n=60):
    recs = [{"id": f"m{i}", "namespace": "ns-a" if i % 2 else "ns-b",
             "content": f"note {i} about deploy window and redis host db-{i}"} for i in range(n)]
    ingest_file(write_jsonl(tmp_path / "m.jsonl", recs), settings, progress=False)


def test_empty_store_gives_an_empty_result(embedded):
    from workers.api import search

    res = search("anything at all")
    assert res.results == [] and res.truncated is False
    assert res.mode == "hybrid"


def test_unknown_namespace_gives_an_empty_result(embedded, tmp_path):
    from workers.api import search

    _store(embedded, tmp_path)
    assert search("deploy window", namespace="no-such-namespace").results == []
    assert search("deploy window", namespace="ns-a").results  # and the known one answers


@pytest.mark.parametrize(
    "query,options,field",
    [
        ("", {}, "query"),
        ("   ", {}, "query"),
        ("x" * 10_001, {}, "query"),
        ("ok", {"mode": "fuzzy"}, "mode"),
        ("ok", {"max_units": -1}, "max_units"),
        ("ok", {"max_chars": 0}, "max_chars"),
        ("ok", {"max_ms": -5}, "max_ms"),
        ("ok", {"recency_boost": -1}, "recency_boost"),
        ("ok", {"recency_boost": float("nan")}, "recency_boost"),
        ("ok", {"weights": {"vector": float("inf"), "fts": 1}}, "weights.vector"),
        ("ok", {"colour": "red"}, "colour"),
        ("ok", {"weights": {"vector": 0, "fts": 0}}, "weights"),
        (42, {}, "query"),
    ],
)
def test_bad_input_is_a_typed_error_naming_the_field(embedded, query, options, field):
    from workers.api import search

    with pytest.raises(InputError) as info:
        search(query, **options)
    assert info.value.field == field


def test_ten_thousand_character_query_is_answered(embedded, tmp_path):
    from workers.api import search

    _store(embedded, tmp_path)
    res = search(("deploy window " * 800)[:10_000], max_units=3)
    assert len(res.results) == 3


def test_modes_record_the_legs_that_ran(embedded, tmp_path):
    from workers.api import search

    _store(embedded, tmp_path)
    for mode in ("keyword", "semantic", "hybrid"):
        res = search("redis host", mode=mode)
        assert res.mode == mode and res.requested_mode.value == mode
    keyword = search("redis host", mode="keyword")
    assert keyword.legs["vector"]["ran"] is False and "embed" not in keyword.timings
    assert all(set(r.ranks) == {"fts"} for r in keyword.results)


def test_identifier_query_returns_its_memory_first(embedded, tmp_path):
    from workers.api import search

    _store(embedded, tmp_path)
    for ident, expected in (("db-17", "m17"), ("db-42", "m42")):
        assert search(ident, mode="keyword").results[0].id == expected


def test_max_ms_holds_when_a_leg_is_slow(embedded, tmp_path, monkeypatch):
    """A full-text leg that would run for minutes is cut at the deadline."""
    from pipeline.store.fulltext import ranking
    from workers.api import search

    _store(embedded, tmp_path)
    search("warm up")  # the model loads on the first query; this test times a leg, not the load

    def slow_search(con, text, scope, limit, settings, postings=None):
        con.execute("SELECT count(*) FROM range(100000000000) t(a) WHERE a % 7 = 3").fetchall()
        return []

    monkeypatch.setattr(ranking, "search", slow_search)
    t0 = time.perf_counter()
    res = search("deploy window", max_ms=400)
    elapsed = time.perf_counter() - t0
    assert elapsed < 5.0  # minutes of work without the deadline
    assert res.truncated and res.truncation.by == "maxMs"
    assert res.legs["fts"]["timed_out"] is True
    assert res.mode == "semantic"  # the leg that finished in time is what was served
    assert res.results  # and its results are served


def test_search_async_returns_results_in_embedded_mode(embedded, tmp_path):
    from workers.api import search, search_async

    _store(embedded, tmp_path)
    handle = search_async("redis host", namespace="ns-a")
    got = handle.get(timeout=10)
    assert [r.id for r in got.results] == [r.id for r in search("redis host", namespace="ns-a").results]
    assert all(r.namespace == "ns-a" for r in got.results)


def test_unreachable_broker_is_a_clear_error(embedded, caplog):
    """...naming the broker without its password, in the error and in every log line."""
    import logging
    import socket

    import workers
    from pipeline.errors import BrokerUnavailableError
    from workers.api import search

    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workers.configure(embedded.replace(broker_url=f"redis://:Tr0ub4dor-and-3@127.0.0.1:{port}/0"))
    caplog.set_level(logging.DEBUG)
    try:
        with pytest.raises(BrokerUnavailableError, match="cannot reach the broker") as info:
            search("anything")
    finally:
        workers.configure(embedded)
    assert "Tr0ub4dor-and-3" not in str(info.value) and "Tr0ub4dor-and-3" not in caplog.text


def test_remember_skip_invalid_reports_every_skipped_record_by_the_callers_number(embedded):
    from workers.api import get, remember

    records = [
        {"id": "ok-1", "namespace": "code", "content": "first good record"},
        {"id": "bad-ns", "namespace": 3, "content": "a namespace that is not a string"},
        {"id": "ok-2", "namespace": "code", "content": "second good record"},
        {"id": "bad-edge", "namespace": "code", "content": "supersedes nothing known", "supersedes": ["nobody"]},
        {"id": "bad-content", "namespace": "code", "content": ""},
    ]
    done = remember(records, skip_invalid=True)
    assert sorted(done.ids) == ["ok-1", "ok-2"]
    numbers = [s.split(":", 1)[0] for s in done.skipped]
    assert numbers == ["record 2", "record 4", "record 5"], done.skipped
    assert "namespace" in done.skipped[0] and "supersedes" in done.skipped[1] and "content" in done.skipped[2]
    assert [m["id"] for m in get(["ok-1", "bad-ns", "ok-2", "bad-edge"])] == ["ok-1", "ok-2"]


def test_get_returns_times_in_utc_marked_as_such(embedded):
    from datetime import datetime

    from workers.api import get, remember

    remember([{"id": "tz-1", "namespace": "code", "content": "written in Berlin",
               "created_at": "2025-06-02T11:00:00+02:00"},
              {"id": "tz-2", "namespace": "code", "content": "written without a zone",
               "created_at": "2025-06-02T09:00:00"}])
    got = {m["id"]: m["created_at"] for m in get(["tz-1", "tz-2"])}
    assert got == {"tz-1": "2025-06-02T09:00:00+00:00", "tz-2": "2025-06-02T09:00:00+00:00"}
    assert datetime.fromisoformat(got["tz-1"]) == datetime.fromisoformat("2025-06-02T11:00:00+02:00")


def test_search_results_carry_times_in_utc_marked_as_such(embedded):
    import json

    from workers.api import remember, search

    remember({"id": "tz-3", "namespace": "code", "content": "the berlin office ships on tuesdays",
              "created_at": "2025-06-02T11:00:00+02:00"})
    res = search("berlin office ships", mode="keyword")
    assert json.loads(res.model_dump_json())["results"][0]["created_at"] == "2025-06-02T09:00:00+00:00"
    assert res.results[0].created_at.tzinfo is None  # in process: naive UTC, as the store keeps it
