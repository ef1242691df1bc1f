"""The demo corpus generator keeps its promises: deterministic, valid, judged.

The tests of this concern for the in-process canvas (the embedded tier); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_demo.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.datasets.demo import write_demo
from tests.conftest import use_store
from tests.unit.test_demo import corpus, judged, seed  # noqa: F401  (helpers and fixtures shared with the unit tests)


def test_write_demo_round_trips(tmp_path: Path, corpus: list[dict], judged: tuple, seed: int) -> None:
    queries, qrels = judged
    paths = write_demo(tmp_path / "demo" / "nested", seed=seed)
    assert set(paths) == {"memories", "queries", "qrels"}
    assert all(p.parent == tmp_path / "demo" / "nested" for p in paths.values())
    memories = [json.loads(line) for line in paths["memories"].read_text(encoding="utf-8").splitlines()]
    assert memories == corpus
    read_queries = [json.loads(line) for line in paths["queries"].read_text(encoding="utf-8").splitlines()]
    assert read_queries == queries
    back: dict[str, dict[str, int]] = {}
    for line in paths["qrels"].read_text(encoding="utf-8").splitlines():
        qid, zero, doc, grade = line.split("\t")
        assert zero == "0"
        back.setdefault(qid, {})[doc] = int(grade)
    assert back == qrels
    # Non-ASCII text (£, é) is written as is, and a second write gives the same bytes.
    raw = paths["memories"].read_bytes()
    assert "£".encode() in raw and b"\\u00a3" not in raw
    again = write_demo(tmp_path / "again", seed=seed)
    for name, path in paths.items():
        assert again[name].read_bytes() == path.read_bytes()


def test_dimple_demo_builds_its_store_then_shows_results_and_figures(embedded, tmp_path, monkeypatch, capsys):
    """The main job end to end (hash embedder): store built once, showcase
    results with graph marks, the quality table for every mode."""
    from workers.cli import main
    from workers.settings import get_settings

    use_store(monkeypatch, embedded)
    monkeypatch.delenv("DIMPLE_BROKER_URL", raising=False)
    get_settings.cache_clear()
    try:
        assert main(["demo"]) == 0
        first = capsys.readouterr().out
        assert "building the demo store" in first
        table = first[first.index("quality on the demo set"):]
        for mode in ("keyword", "semantic", "hybrid"):
            figures = re.search(rf"^\s+{mode}\s+([0-9.]+)\s", table, re.M)
            assert figures and 0 < float(figures.group(1)) <= 1, mode
        assert re.search(r"^query q\d+ \[", first, re.M) and "mode hybrid" in first
        # the budget section cuts (it showed the scope's rows again), the audit trail of a showcase query is shown
        budget = first[first.index("a budget cut: at most"):]
        assert re.search(r"^mode hybrid, \d+ ms, truncated by maxChars \(limit \d+, \d+ left out\)$", budget, re.M)
        trail = first[first.index("the audit trail of the first query above"):]
        assert "dimple audit explain" in trail and re.search(r"^  #1 +\S+: convex [0-9.]+ \(", trail, re.M)
        assert "that query's\nown time" in first  # what a showcase's ms counts
        assert main(["demo"]) == 0  # second run reuses the store
        assert "building the demo store" not in capsys.readouterr().out
    finally:
        get_settings.cache_clear()


def test_dimple_demo_runs_embedded_on_its_own_store_when_a_broker_is_set(embedded, monkeypatch, capsys):
    """With DIMPLE_BROKER_URL exported (here a broker that answers nothing) the
    demo still queries its own store in this process, and says so on stderr."""
    from workers.cli import main
    from workers.settings import get_settings

    use_store(monkeypatch, embedded)
    monkeypatch.setenv("DIMPLE_BROKER_URL", "redis://127.0.0.1:1/0")
    get_settings.cache_clear()
    try:
        assert main(["demo"]) == 0
        captured = capsys.readouterr()
        assert "the demo runs embedded, in this process" in captured.err
        assert "DIMPLE_BROKER_URL is not used" in captured.err
        table = captured.out[captured.out.index("quality on the demo set"):]
        hybrid = re.search(r"^\s+hybrid\s+([0-9.]+)\s", table, re.M)
        assert hybrid and 0 < float(hybrid.group(1)) <= 1
    finally:
        get_settings.cache_clear()


def test_the_demo_store_is_kept_until_a_rebuild_builds_it_again(embedded, capsys) -> None:
    """``dimple demo`` reuses its store; ``--rebuild`` removes it (its
    catalog, files and bases, all in the demo's folder) and builds it anew."""
    import workers
    from workers.api import search
    from workers.cli.demo import build_demo_store, demo_settings

    demo = demo_settings(embedded)
    workers.configure(demo)
    for rebuild, built in ((False, True), (False, False), (True, True)):
        build_demo_store(demo, rebuild=rebuild)
        assert ("building the demo store" in capsys.readouterr().out) is built, rebuild
        assert search("billing", mode="keyword").results  # the store answers after each
