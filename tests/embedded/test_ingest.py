"""Ingest: validation of every bad line, all-or-nothing writes, updates, the CLI.

The tests of this concern for the in-process canvas (the embedded tier); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_ingest.py``.
"""

from __future__ import annotations

import json

from tests.conftest import use_store, write_jsonl
from tests.unit.test_ingest import _mem, store_with_base  # noqa: F401  (helpers and fixtures shared with the unit tests)
from workers.cli import main
from workers.cli.common import ingest_file


def test_new_memory_is_searchable_as_soon_as_ingest_returns(store_with_base, tmp_path, embedded):
    from workers import resources
    from workers.api import search

    assert search("ZEBRA_4471", mode="keyword").results == []
    resources.current().close_store()
    ingest_file(write_jsonl(tmp_path / "z.jsonl", [_mem(500, content="saw ZEBRA_4471 in the logs")]),
                store_with_base, progress=False)
    res = search("ZEBRA_4471", mode="keyword")
    assert [r.id for r in res.results] == ["m500"]


def test_cli_exit_code_and_one_line_for_user_errors(settings, tmp_path, monkeypatch, capsys):
    use_store(monkeypatch, settings)
    from workers.settings import get_settings

    get_settings.cache_clear()
    try:
        assert main(["ingest", str(tmp_path / "missing.jsonl")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no such file" in err[0]
        assert main(["search", "x", "--mode", "bogus"]) == 2
        assert "valid modes: keyword, semantic, hybrid" in capsys.readouterr().err
        assert main(["ingest", str(write_jsonl(tmp_path / "empty.jsonl", []))]) == 0
        assert capsys.readouterr().out.rstrip().endswith("nothing to write: no store was created")  # not "version 0 kept"
        good = write_jsonl(tmp_path / "ok.jsonl", [_mem(1), _mem(2)])
        assert main(["ingest", str(good), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["inserted"] == 2
        assert main(["stats", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["memories"] == 2
        assert main(["config"]) == 0
    finally:
        get_settings.cache_clear()


def test_context_is_searchable_by_keyword_but_not_content(settings, tmp_path, embedded):
    from workers import resources
    from workers.api import search

    recs = [_mem(1, content="Yes, twice last week!", context="Did you visit the Louvre in Paris?"),
            _mem(2, content="Paris was rainy")]
    ingest_file(write_jsonl(tmp_path / "c.jsonl", recs), settings, progress=False)
    res = search("Louvre", mode="keyword")
    assert [r.id for r in res.results] == ["m1"]
    assert res.results[0].content == "Yes, twice last week!"
    resources.current().close_store()
    # a changed context alone is re-indexed, not re-embedded
    recs[0]["context"] = "Did you see the Colosseum?"
    report = ingest_file(write_jsonl(tmp_path / "c2.jsonl", recs[:1]), settings, progress=False)
    assert (report.updated, report.embedded) == (1, 0)
    assert [r.id for r in search("Colosseum", mode="keyword").results] == ["m1"]
    assert search("Louvre", mode="keyword").results == []


def test_a_write_reports_the_seconds_it_spent_embedding(settings, tmp_path, embedded):
    """``dimple demo`` prints them ("embedding 0.0s" whatever it took, before)."""
    path = write_jsonl(tmp_path / "e.jsonl", [_mem(i) for i in range(40)])
    first = ingest_file(path, settings, progress=False)  # the store's first write: a base
    assert first.embedded == 40 and 0 < first.seconds["embed"] <= first.seconds["total"]
    delta = ingest_file(write_jsonl(tmp_path / "d.jsonl", [_mem(41)]), settings, progress=False)
    assert delta.embedded == 1 and 0 < delta.seconds["embed"] <= delta.seconds["total"]
    again = ingest_file(path, settings, progress=False)
    assert (again.unchanged, again.embedded, again.seconds["embed"]) == (40, 0, 0.0)


def test_stats_count_the_pending_writes_and_forgets_as_a_compaction_would(settings, embedded, tmp_path, monkeypatch,
                                                                          capsys):
    """``dimple stats`` reads the store as a query does: the base with its
    deltas merged; before, it counted the base alone until a compaction."""
    use_store(monkeypatch, settings)
    from workers.settings import get_settings

    def stats() -> dict:
        capsys.readouterr()
        assert main(["stats", "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    get_settings.cache_clear()
    try:
        base = [_mem(i, ns="alpha") for i in range(6)] + [_mem(6, ns="beta", supersedes=["m5"])]
        assert main(["ingest", str(write_jsonl(tmp_path / "base.jsonl", base))]) == 0
        before = stats()
        assert (before["memories"], before["by_namespace"], before["edges"]) == (7, {"alpha": 6, "beta": 1},
                                                                                 {"supersedes": 1})
        later = [_mem(10, ns="ops", content_type="runbook", supported_by=["m1"]),  # a new namespace, type, link
                 _mem(6, ns="alpha", content="m6 rewritten, moved to alpha, no longer superseding m5")]
        assert main(["ingest", str(write_jsonl(tmp_path / "later.jsonl", later))]) == 0
        assert main(["forget", "m2", "m3"]) == 0
        pending = stats()
        assert pending["segments"]["deltas"] == 2 and pending["segments"]["delta_forgotten"] == 2, pending["segments"]
        assert pending["memories"] == 6
        assert pending["by_namespace"] == {"alpha": 5, "ops": 1}  # beta is empty: m6 moved
        assert pending["by_content_type"] == {"runbook": 1, "text": 5}
        assert pending["edges"] == {"supports": 1}  # m6's supersedes was voided by its rewrite
        assert main(["compact"]) == 0
        after = stats()
        assert after["segments"]["deltas"] == 0
        for key in ("memories", "namespaces", "by_namespace", "by_content_type", "edges"):
            assert pending[key] == after[key], key
    finally:
        get_settings.cache_clear()
