"""Supersession through the in-process canvas, the Python API, the CLI and the
audit trail, on the README's deploy-window memories: each value serves what
it promises, one batch mixes values, the audit row records the value and
``audit explain``'s replay reproduces the served list."""

from __future__ import annotations

import pytest

from pipeline import audit as pa
from tests.conftest import use_store, write_jsonl
from workers.cli import main
from workers.cli.common import ingest_file

README = [
    {"id": "deploy-1", "namespace": "code", "content_type": "decision", "content": "We deploy on Fridays before noon.",
     "topics": ["deploy"], "created_at": "2025-01-10T09:00:00Z"},
    {"id": "deploy-2", "namespace": "code", "content_type": "decision",
     "content": "No deploys on Fridays any more: the deploy window is Tuesday to Thursday.", "topics": ["deploy"],
     "supersedes": ["deploy-1"], "created_at": "2025-06-02T09:00:00Z"},
    {"id": "err-1", "namespace": "code", "content": "ERR_CONN_RESET from the staging database host db-stg-2 means the connection pool is full.",
     "topics": ["database"], "concepts": ["postgres"]},
    {"id": "food-1", "namespace": "messages", "content": "Priya is vegetarian; the team liked the Thai place near the office.",
     "topics": ["team"]},
]
# "noon" is in deploy-1 only: the full-text leg finds the superseded memory and not its successor
QUERY = "noon"
SERVED = {"annotate": ["deploy-1"], "promote": ["deploy-2", "deploy-1"], "hide": ["deploy-2"]}


@pytest.fixture
def readme_store(embedded, tmp_path):
    ingest_file(write_jsonl(tmp_path / "memories.jsonl", README), embedded, progress=False)
    return embedded


@pytest.mark.parametrize("value", ["annotate", "promote", "hide"])
def test_each_value_through_the_api_audit_and_replay(readme_store, value):
    from workers import audit
    from workers.api import replay_row, search

    res = search(QUERY, mode="keyword", supersession=value)
    assert [r.id for r in res.results] == SERVED[value]
    assert res.hidden_superseded == (1 if value == "hide" else 0)
    if value != "annotate":
        assert res.results[0].promoted_above == "deploy-1" and res.results[0].ranks == {}
    audit.flush()
    row = pa.get(pa.log_of(readme_store), res.query_id)
    assert row.options["supersession"] == value
    assert row.query_profile["hidden_superseded"] == res.hidden_superseded
    assert [p["promoted_above"] for p in pa.explain(row)] == [r.promoted_above for r in res.results]
    replay = replay_row(row)
    assert replay["verdict"] == "same list", replay


def test_the_default_promotes_the_readme_successor(readme_store):
    from workers.api import search

    res = search(QUERY, mode="keyword")
    assert [r.id for r in res.results] == SERVED["promote"]
    assert [l.id for l in res.results[1].superseded_by] == ["deploy-2"]


def test_one_batch_serves_each_query_by_its_own_value(readme_store):
    from workers.api import search_many

    asks = [{"query": QUERY, "mode": "keyword", "supersession": v} for v in SERVED]
    for value, res in zip(SERVED, search_many(asks)):
        assert [r.id for r in res.results] == SERVED[value], value


def test_a_scope_the_successor_is_outside_of_leaves_the_superseded_one_as_annotated(readme_store):
    from workers.api import remember, search

    remember({"id": "deploy-3", "namespace": "messages", "content": "deploys now happen on Mondays",
              "supersedes": ["deploy-2"]})
    scoped = search("deploy window tuesday", mode="keyword", namespace="code", supersession="hide")
    # deploy-1 is hidden for deploy-2; deploy-2 stays (its successor is outside), and deploy-3 is nowhere
    assert [r.id for r in scoped.results] == ["deploy-2"] and scoped.hidden_superseded == 1
    assert scoped.results[0].superseded_by == []
    free = search("deploy window tuesday", mode="keyword", supersession="hide")
    assert [r.id for r in free.results] == ["deploy-3"] and free.hidden_superseded == 2


def test_cli_search_takes_the_option_and_explain_names_the_promotion(readme_store, monkeypatch, capsys):
    from workers import audit
    from workers.settings import get_settings

    use_store(monkeypatch, readme_store)
    monkeypatch.delenv("DIMPLE_BROKER_URL", raising=False)
    get_settings.cache_clear()
    try:
        assert main(["search", QUERY, "--mode", "keyword", "--supersession", "hide"]) == 0
        out = capsys.readouterr().out
        assert "deploy-2" in out and "deploy-1" not in out.replace("current version of deploy-1", "")
        assert "1 superseded result(s) hidden" in out
        assert main(["search", QUERY, "--mode", "keyword"]) == 0
        capsys.readouterr()
        audit.flush()
        row = pa.tail(pa.log_of(readme_store), 1)[0]
        assert main(["audit", "explain", row.query_id]) == 0
        out = capsys.readouterr().out
        assert "promoted above deploy-1" in out and "replay now: same list" in out
        assert main(["search", QUERY, "--supersession", "newest"]) == 2
    finally:
        get_settings.cache_clear()
