"""``dimple eval compare`` reads run folders: one that is not a dimple run
report is a typed error naming the file, not a KeyError later."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import InputError
from workers.cli.eval import load_run_folder


def _folder(tmp_path, report) -> object:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps(report), encoding="utf-8")
    (folder / "run.trec").write_text("q1 Q0 d1 1 1 r\n", encoding="utf-8")
    (folder / "qrels.trec").write_text("q1 0 d1 1\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("report", [{"name": "x"}, [1, 2], "text"])
def test_a_report_that_is_not_a_run_report_is_refused(tmp_path, report):
    with pytest.raises(InputError, match="not a dimple run report"):
        load_run_folder(_folder(tmp_path, report))


def test_a_run_report_loads(tmp_path):
    keys = ["name", "query_set", "config", "queries", "answered", "failed", "skipped", "seconds", "queries_per_s",
            "metrics", "per_query", "latency_ms"]
    report, run, qrels = load_run_folder(_folder(tmp_path, {k: None for k in keys}))
    assert report["name"] is None and run == {"q1": ["d1"]} and qrels == {"q1": {"d1": 1}}
