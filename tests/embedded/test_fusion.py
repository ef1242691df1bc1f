"""The fusion option end to end in process: ``fusion=convex`` (the default
since issue 31) and ``rrf`` from the Python API, the CLI and the setting,
recorded in the audit row and replayed."""

from __future__ import annotations

import json

import pytest

from pipeline import audit as pa
from tests.conftest import use_store, write_jsonl
from tests.embedded.test_supersession import README
from workers.cli import main
from workers.cli.common import ingest_file

QUERY = "deploy window Tuesday to Thursday"  # deploy-2 leads both legs


@pytest.fixture
def readme_store(embedded, tmp_path):
    ingest_file(write_jsonl(tmp_path / "memories.jsonl", README), embedded, progress=False)
    return embedded


def test_convex_scores_are_shares_of_normalised_leg_scores_and_replay(readme_store):
    from workers import audit
    from workers.api import replay_row, search

    res = search(QUERY, fusion="convex", supersession="annotate")
    top = res.results[0]
    assert top.id == "deploy-2" and top.ranks == {"vector": 1, "fts": 1}
    assert top.score == pytest.approx(1.0)  # the best of both legs: 0.5 * 1 + 0.5 * 1
    assert all(0.0 <= r.score <= 1.0 for r in res.results)
    assert [r.score for r in res.results] == sorted((r.score for r in res.results), reverse=True)
    assert [r.id for r in search(QUERY, supersession="annotate").results] == [r.id for r in res.results]  # the default
    rrf = search(QUERY, fusion="rrf", supersession="annotate")
    assert rrf.results[0].score < 0.5  # RRF terms are w / (k + rank): at most 2 / 11 with k 10
    audit.flush()
    row = pa.get(pa.log_of(readme_store), res.query_id)
    assert row.options["fusion"] == "convex" and pa.get(pa.log_of(readme_store), rrf.query_id).options["fusion"] == "rrf"
    assert replay_row(row)["verdict"] == "same list"
    # explain gives a convex row's fused score, not RRF terms it was never the sum of
    paths = pa.explain(row)
    assert paths[0]["fusion"] == "convex" and paths[0]["rrf"] == pytest.approx(1.0)
    assert all("rrf_contributions" not in p for p in paths)
    rrf_paths = pa.explain(pa.get(pa.log_of(readme_store), rrf.query_id))
    assert all(p["fusion"] == "rrf" and sum(p["rrf_contributions"].values()) == pytest.approx(p["rrf"])
               for p in rrf_paths)


def test_audit_explain_prints_a_convex_query_without_rrf_terms(readme_store, monkeypatch, capsys):
    from workers import audit
    from workers.api import search

    res = search(QUERY, fusion="convex", supersession="annotate")
    audit.flush()
    use_store(monkeypatch, readme_store)
    from workers.settings import get_settings

    get_settings.cache_clear()
    try:
        assert main(["audit", "explain", res.query_id, "--no-replay"]) == 0
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr().out
    assert "#1   deploy-2: convex 1.00000 (fts rank 1, vector rank 1) -> 1.00000" in out
    assert "rrf " not in out


def test_the_setting_and_the_cli_option(readme_store, monkeypatch, capsys):
    import workers
    from workers.api import search

    workers.configure(readme_store.replace(fusion="convex", convex_alpha=1.0))
    res = search(QUERY, supersession="annotate")
    vector_only = search(QUERY, mode="semantic", supersession="annotate")
    assert [r.id for r in res.results] == [r.id for r in vector_only.results]  # alpha 1: the vector leg's order
    workers.configure(readme_store)
    use_store(monkeypatch, readme_store)
    assert main(["search", QUERY, "--fusion", "convex", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["results"][0]["score"] == pytest.approx(1.0)
    assert main(["search", QUERY, "--fusion", "linear"]) == 2
    assert "fusion" in capsys.readouterr().err
