"""``run_local`` (the declared stages in the canvas's shape, no Celery) and
the eager canvas behind ``workers.api`` give the same answers."""

from __future__ import annotations

from pipeline.contracts import Batch, Results, make_query
from pipeline.stages.registry import run_local
from tests.conftest import write_jsonl
from workers.cli.common import ingest_file


def test_run_local_answers_as_the_canvas_does(embedded, tmp_path):
    from workers import resources
    from workers.api import search

    recs = [{"id": f"m{i}", "namespace": "a" if i % 3 else "b", "content_type": "code" if i % 2 else "text",
             "content": f"note {i} about the deploy window, redis host db-{i % 7} and ERR_{i % 5}",
             **({"supersedes": [f"m{i - 1}"]} if i % 10 == 9 else {})} for i in range(40)]
    ingest_file(write_jsonl(tmp_path / "m.jsonl", recs), embedded, progress=False)
    asks = [("deploy window", {}), ("db-3", {"mode": "keyword"}), ("redis host", {"mode": "semantic", "namespace": "a"}),
            ("ERR_2 deploy", {"content_type": "code", "max_units": 3}), ("note", {"max_chars": 60})]
    for text, options in asks:
        query = make_query(text, {**options, "now": "2026-01-01T00:00:00"}, embedded)
        local = Results.from_state(run_local(Batch(states=[{"query": query}]), resources.current()).states[0])
        canvas = search(text, **options, now="2026-01-01T00:00:00")
        assert local.results, text
        assert [(r.id, r.score, r.ranks) for r in local.results] == [(r.id, r.score, r.ranks) for r in canvas.results]
        assert (local.mode, local.truncated, local.truncation) == (canvas.mode, canvas.truncated, canvas.truncation)
        assert [[link.id for link in r.superseded_by] for r in local.results] == \
               [[link.id for link in r.superseded_by] for r in canvas.results]
