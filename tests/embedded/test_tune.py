"""``dimple tune`` on the unit tier (hash embedder, in-process pipeline): a
corpus whose full-text leg is clearly the better one makes tune lean to it,
``--apply`` stores that, a query then fuses with it (and its audit row says
so) while a query's own options still win; no significant gain stores
nothing; ``--reset`` returns to the environment's settings; fewer than 20
judged queries are refused naming the field."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import workers
from pipeline.store.tuned import TunedFusion, read_tuned, write_tuned
from tests.conftest import store_settings, use_store, write_jsonl
from workers import api, audit, resources
from workers.cli import main
from workers.cli.common import ingest_file
from workers.cli.tune import EXIT_NOT_SIGNIFICANT
from workers.resources import TUNED_CHECK_S

N_QUERIES = 24
COMMON = "kettle orchard lantern"  # in every query and every distractor: the vector leg follows these


def _corpus() -> list[dict]:
    """Per query one relevant memory holding its rare code word and nothing
    else of the query; 30 distractors holding the query's common words. BM25
    finds the code word (rare: high IDF); the hashed vectors mostly see the
    three common words, so the semantic leg ranks distractors first."""
    recs = [{"id": f"rel{i}", "namespace": "n",
             "content": f"zx{i}code filed under ledger {i} with margin notes and stamps"} for i in range(N_QUERIES)]
    recs += [{"id": f"d{j}", "namespace": "n", "content": f"{COMMON} remark {j} plain"} for j in range(30)]
    return recs


def _inputs(tmp_path: Path, n: int = N_QUERIES) -> tuple[Path, Path]:
    queries = write_jsonl(tmp_path / "queries.jsonl",
                          [{"id": f"q{i}", "query": f"{COMMON} zx{i}code"} for i in range(n)])
    qrels = tmp_path / "qrels.trec"
    qrels.write_text("".join(f"q{i} 0 rel{i} 1\n" for i in range(n)), encoding="utf-8")
    return queries, qrels


@pytest.fixture
def tune_env(settings, tmp_path, monkeypatch):
    """The store; the CLI and this process on the same settings, whose
    current fusion leans the wrong way (convex, vector share 0.9)."""
    from workers.settings import get_settings

    current = settings.replace(convex_alpha=0.9)
    workers.configure(current)
    ingest_file(write_jsonl(tmp_path / "m.jsonl", _corpus()), current, progress=False)
    use_store(monkeypatch, current)
    monkeypatch.setenv("DIMPLE_CONVEX_ALPHA", "0.9")
    monkeypatch.delenv("DIMPLE_BROKER_URL", raising=False)
    get_settings.cache_clear()
    yield current
    get_settings.cache_clear()
    audit.flush()
    resources.current().close_store()


def _logged(query_id: str):
    audit.flush()
    return api.audit_row(query_id)


def test_tune_leans_to_the_better_leg_applies_and_every_query_uses_it(tune_env, tmp_path, capsys):
    queries, qrels = _inputs(tmp_path)
    assert main(["tune", str(queries), str(qrels)]) == 0  # without --apply: a table, nothing stored
    out = capsys.readouterr().out
    assert "current: convex alpha=0.9" in out and "p=" in out and "--apply would store convex alpha=" in out
    assert read_tuned(tune_env) is None

    assert main(["tune", str(queries), str(qrels), "--apply"]) == 0
    out = capsys.readouterr().out
    tuned = read_tuned(tune_env)
    assert tuned is not None and tuned.version == 1 and "applied: " in out
    assert tuned.settings.fusion == "convex" and tuned.settings.convex_alpha is not None
    assert tuned.settings.convex_alpha < 0.5  # leans to the full-text leg, the better one here
    ev = tuned.evidence
    assert ev["queries"] == N_QUERIES and ev["folds"] == 5 and ev["gain"] > 0 and ev["p_value"] < 0.05
    assert len(ev["per_fold"]) == 5 and sum(f["queries"] for f in ev["per_fold"]) == N_QUERIES

    # a process configured with the environment's settings uses the store's
    workers.configure(tune_env)
    res = api.search(f"{COMMON} zx3code", namespace="n")
    assert res.results[0].id == "rel3"
    row = _logged(res.query_id)
    assert row.options["fusion"] == "convex"
    assert row.query_profile["settings"]["convex_alpha"] == tuned.settings.convex_alpha
    assert row.query_profile["weights"]["vector"] == pytest.approx(tuned.settings.convex_alpha)
    # a query's own options win over the tuned settings
    own = api.search(f"{COMMON} zx3code", namespace="n", weights={"vector": 1.0, "fts": 0.25})
    assert _logged(own.query_id).query_profile["weights"] == {"vector": 1.0, "fts": 0.25}
    rrf = api.search(f"{COMMON} zx3code", namespace="n", fusion="rrf")
    assert _logged(rrf.query_id).options["fusion"] == "rrf"
    # `dimple config` shows what the store's queries run with
    assert main(["config"]) == 0
    assert json.loads(capsys.readouterr().out)["convex_alpha"] == tuned.settings.convex_alpha

    # tuned again: the store's settings are now the current ones and nothing beats them significantly
    assert main(["tune", str(queries), str(qrels), "--apply"]) == EXIT_NOT_SIGNIFICANT
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "nothing applied" in err and "not significant" in err
    assert f"current: convex alpha={tuned.settings.convex_alpha:g}" in captured.out
    assert read_tuned(tune_env).version == 1  # unchanged

    assert main(["tune", "--show"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 1
    assert main(["tune", "--reset"]) == 0
    assert read_tuned(tune_env) is None
    capsys.readouterr()
    workers.configure(tune_env)  # the tune command ran in this process without audit rows
    back = api.search(f"{COMMON} zx3code", namespace="n")
    assert _logged(back.query_id).query_profile["settings"]["convex_alpha"] == 0.9  # the environment's again


def test_stored_settings_apply_at_the_next_call_unless_a_process_turns_them_off(settings):
    workers.configure(settings)
    api.remember([{"id": "m", "namespace": "n", "content": "a store to keep tuned settings in"}])
    res = resources.current()
    assert (res.settings().fusion, res.settings().rrf_k) == ("convex", 10)
    write_tuned(settings, TunedFusion(fusion="rrf", rrf_k=60))
    time.sleep(TUNED_CHECK_S)  # the most a running process takes to see it: no restart, no reconfigure
    assert (res.settings().fusion, res.settings().rrf_k) == ("rrf", 60)
    # settings handed back (as a replay does) do not keep the store's values once they are removed
    workers.configure(res.settings())
    write_tuned(settings, None)
    time.sleep(TUNED_CHECK_S)
    assert (res.settings().fusion, res.settings().rrf_k) == ("convex", 10)
    write_tuned(settings, TunedFusion(fusion="convex", convex_alpha=0.2))
    time.sleep(TUNED_CHECK_S)
    assert read_tuned(settings).version == 1 and res.settings().convex_alpha == 0.2
    workers.configure(settings.replace(use_tuned=False))
    assert res.settings().convex_alpha == settings.convex_alpha != 0.2
    workers.configure(settings)
    res.close_store()


def test_an_embedded_replay_leaves_the_process_settings_and_other_threads_audit_alone(settings, monkeypatch):
    """``replay_row`` (``dimple audit explain``, the MCP explain tool) writes no
    row for its own query, and only for it: a query another thread runs
    meanwhile is logged, and the store's tuned settings are still followed
    after it (a reset applies) rather than kept as the process's own."""
    import threading

    from pipeline.errors import InputError

    workers.configure(settings)
    api.remember([{"id": "m", "namespace": "n", "content": "a store to keep tuned settings in"}])
    res = resources.current()
    write_tuned(settings, TunedFusion(fusion="rrf", rrf_k=60))
    time.sleep(TUNED_CHECK_S)
    assert res.settings().fusion == "rrf"
    row = _logged(api.search("tuned settings", namespace="n").query_id)
    real, meanwhile = api.search, []

    def search(*args, **kwargs):  # the replay's query, with another thread's query while it runs
        thread = threading.Thread(target=lambda: meanwhile.append(real("a store", namespace="n")))
        thread.start()
        thread.join()
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "search", search)
    replay = api.replay_row(row)
    assert replay["verdict"] == "same list" and replay["logged_as"] is None
    assert _logged(meanwhile[0].query_id).query_text == "a store"
    with pytest.raises(InputError):
        _logged(replay["replay_query_id"])
    write_tuned(settings, None)
    time.sleep(TUNED_CHECK_S)
    assert (res.settings().fusion, res.settings().rrf_k) == ("convex", 10)
    res.close_store()


def test_fewer_than_twenty_judged_queries_are_refused_naming_the_field(tune_env, tmp_path, capsys):
    queries, qrels = _inputs(tmp_path, n=19)
    assert main(["tune", str(queries), str(qrels), "--apply"]) == 2
    err = capsys.readouterr().err
    assert "QUERIES" in err and "19 judged queries" in err and "at least 20" in err
    assert read_tuned(tune_env) is None
    queries, qrels = _inputs(tmp_path)
    assert main(["tune", str(queries), str(qrels), "--folds", "1"]) == 2
    assert "--folds" in capsys.readouterr().err


def test_re_fusing_the_legs_gives_what_a_search_with_that_configuration_serves(tune_env, tmp_path):
    """``fused_runs`` runs each query's legs once and re-fuses them per
    configuration: each configuration's lists equal the searches' own."""
    from pipeline import evaluation as ev
    from pipeline.evaluation.tune import FusionConfig, fused_runs

    queries = [ev.QuerySpec(f"q{i}", f"{COMMON} zx{i}code", {"namespace": "n"}) for i in range(4)]
    queries.append(ev.QuerySpec("own", f"{COMMON} zx1code", {"fusion": "rrf"}))  # its own option wins
    qset = ev.QuerySet("s", queries, {})
    configs = [FusionConfig("convex", convex_alpha=0.2), FusionConfig("rrf", rrf_k=60)]
    res = resources.current()
    runs = fused_runs(qset, res.settings(), res, res.snapshot(), configs, defaults={"max_units": 20})
    for config in configs:
        workers.configure(config.apply(tune_env))
        served = api.search_many([{"query": q.text, "max_units": 20, **q.options} for q in queries])
        assert runs[config] == {q.id: [r.id for r in s.results] for q, s in zip(queries, served)}, config.name
    assert runs[configs[0]]["q0"] != runs[configs[1]]["q0"]  # the configurations do differ here


def test_on_the_lake_tune_applied_through_one_host_is_what_every_host_serves(tmp_path, monkeypatch, capsys):
    """Two data dirs (two hosts) over one lake: ``dimple tune --apply`` run on
    one stores the choice in the lake (no TUNED.json anywhere), and a process
    already serving the other data dir fuses with it from its next settings
    look; ``--reset`` on the other host removes it for both."""
    from pipeline.settings import StoreSettings
    from workers.resources import Resources
    from workers.settings import get_settings

    lake = {"catalog": f"sqlite:{tmp_path / 'shared' / 'lake.sqlite'}",
            "data_path": tmp_path / "shared" / "lake"}
    one = store_settings(tmp_path).replace(data_dir=tmp_path / "host1", convex_alpha=0.9, store=StoreSettings(**lake))
    two = one.replace(data_dir=tmp_path / "host2")
    workers.configure(one)
    ingest_file(write_jsonl(tmp_path / "m.jsonl", _corpus()), one, progress=False)
    other = Resources(two)  # a process of host 2, serving queries already
    try:
        assert other.settings().convex_alpha == 0.9 and other.snapshot() is not None

        env = {"DIMPLE_DATA_DIR": str(one.data_dir), "DIMPLE_EMBEDDING_MODEL": "hash-64", "DIMPLE_CONVEX_ALPHA": "0.9",
               "DIMPLE_STORE__CATALOG": lake["catalog"],
               "DIMPLE_STORE__DATA_PATH": str(lake["data_path"])}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("DIMPLE_BROKER_URL", raising=False)
        get_settings.cache_clear()
        queries, qrels = _inputs(tmp_path)
        assert main(["tune", str(queries), str(qrels), "--apply"]) == 0
        assert "the lake at sqlite:" in capsys.readouterr().out
        tuned = read_tuned(two)  # read from host 2's side: the lake's row
        assert tuned is not None and tuned.version == 1 and tuned.settings.convex_alpha < 0.5
        assert not list(tmp_path.rglob("TUNED.json"))

        time.sleep(TUNED_CHECK_S)  # the most a running process takes to look again
        assert other.settings().convex_alpha == tuned.settings.convex_alpha

        monkeypatch.setenv("DIMPLE_DATA_DIR", str(two.data_dir))
        get_settings.cache_clear()
        assert main(["tune", "--reset"]) == 0
        assert f"removed tuned settings version 1 from the lake at {lake['catalog']}" in capsys.readouterr().out
        assert read_tuned(one) is None
        time.sleep(TUNED_CHECK_S)
        assert other.settings().convex_alpha == 0.9

        # a row this dimple cannot read is an error naming it, never silently the defaults
        from pipeline.errors import StoreError
        from pipeline.store.lake import Lake

        con = Lake.open(one).con
        con.execute("BEGIN TRANSACTION")
        con.execute("UPDATE tuned SET document = ?", ['{"version": "not a number"}'])
        con.execute("COMMIT")
        time.sleep(TUNED_CHECK_S)
        with pytest.raises(StoreError, match="holds no tuned settings this dimple reads"):
            other.settings()
        assert main(["tune", "--reset"]) == 0  # what the error advises: it removes even an unreadable row
        time.sleep(TUNED_CHECK_S)
        assert other.settings().convex_alpha == 0.9
    finally:
        get_settings.cache_clear()
        other.close_store()
        audit.flush()
        resources.current().close_store()
