"""Evaluation traffic in the audit log: ``dimple eval`` marks its queries
``eval``, a replay marks its own ``replay`` (``Origin``), and a replay of the
log re-runs callers' queries only, so a replay through the workers (which log
every query) never replays the replays."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace

import pytest

from pipeline import audit
from pipeline import evaluation as ev
from pipeline.contracts import Origin, QueryOptions, make_query, recorded_origin
from pipeline.errors import EvalInputError
from pipeline.settings import Settings


def _row(query_id: str, options: dict) -> audit.AuditRecord:
    return audit.AuditRecord(
        query_id=query_id, logged_at=datetime(2026, 1, 1), query_hash="0" * 16, hash_of="text", mode="keyword",
        requested_mode="keyword", query_text=f"text of {query_id}", options=options, query_profile={},
        sources=[], result_count=0, truncated=False, total_ms=1.0, rrf_k=60,
    )


class _Searches:
    """A ``search_many`` that records what it was asked and serves nothing."""

    def __init__(self) -> None:
        self.asked: list[dict] = []

    def __call__(self, asks, batch_size=None, **_):
        self.asked += asks
        return [SimpleNamespace(results=[], timings={}, total_ms=1.0, mode="keyword", store_version=None)
                for _ in asks]


def test_the_audit_row_records_who_asked_and_older_rows_were_callers() -> None:
    settings = Settings(_env_file=None)
    assert make_query("q", {}, settings).recorded()["origin"] == "query"
    assert make_query("q", {"origin": "eval"}, settings).recorded()["origin"] == "eval"
    assert recorded_origin({"mode": "hybrid"}) is Origin.query  # a row from before the field
    assert recorded_origin({"origin": "replay"}) is Origin.replay
    with pytest.raises(ValueError, match="origin"):
        QueryOptions(origin="bench")  # type: ignore[arg-type]


def test_replay_reruns_callers_queries_only_and_marks_its_own() -> None:
    rows = [_row("a", {"origin": "query"}), _row("b", {}), _row("c", {"origin": "eval"}),
            _row("d", {"origin": "replay"})]
    searches = _Searches()
    report = ev.replay(searches, rows)
    assert [a["query"] for a in searches.asked] == ["text of a", "text of b"]
    assert {a["origin"] for a in searches.asked} == {"replay"}
    assert report["rows"] == 4 and report["replayed"] == 2
    assert report["skipped"] == {"evaluation_traffic": {"count": 2, "ids": ["c", "d"]}}


def test_a_log_of_evaluation_traffic_only_has_nothing_to_replay() -> None:
    with pytest.raises(EvalInputError, match="2 of evaluation traffic"):
        ev.replay(_Searches(), [_row("c", {"origin": "eval"}), _row("d", {"origin": "replay"})])


def test_eval_marks_every_query_whatever_its_own_options_say() -> None:
    searches = _Searches()
    specs = [ev.QuerySpec("q1", "one", {}), ev.QuerySpec("q2", "two", {"origin": "query"})]
    ev.run_queries(searches, specs, defaults={"max_units": 5}, origin=Origin.eval)
    assert [(a["query"], a["origin"], a["max_units"]) for a in searches.asked] == [("one", "eval", 5), ("two", "eval", 5)]
