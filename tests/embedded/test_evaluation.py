"""dimple eval on the unit tier (hash embedder, eager pipeline): runs, metrics
against a hand-worked example and against ranx reading the written run file,
comparisons, audit replay after a settings change, bad inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import evaluation as ev
from tests.conftest import use_store, write_jsonl
from workers.cli import main
from workers.cli.common import ingest_file

TOPICS = ["deploy window", "database failover", "cache eviction", "kafka lag", "tls certificate",
          "vegetarian restaurant", "flight to lisbon", "dentist appointment"]


def _corpus() -> list[dict]:
    recs = []
    for t, topic in enumerate(TOPICS):
        ns = "code" if t < 5 else "messages"
        for i in range(6):
            recs.append({"id": f"m{t}-{i}", "namespace": ns,
                         "content": f"{topic} note {i}: detail {t * 10 + i} about {topic.split()[0]} item-{t}-{i}"})
    return recs


def _queries_and_qrels(tmp_path: Path) -> tuple[Path, Path]:
    queries = [{"id": f"q{t}", "query": f"{topic} item-{t}-{t % 6}", "namespace": "code" if t < 5 else "messages"}
               for t, topic in enumerate(TOPICS)]
    qrels = [f"q{t} 0 m{t}-{i} {2 if i == t % 6 else 1}" for t in range(len(TOPICS)) for i in range(6)]
    return write_jsonl(tmp_path / "queries.jsonl", queries), _write(tmp_path / "qrels.trec", qrels)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def cli_env(embedded, tmp_path, monkeypatch):
    """A small store, the CLI reading the same settings as the test."""
    from workers.settings import get_settings

    ingest_file(write_jsonl(tmp_path / "m.jsonl", _corpus()), embedded, progress=False)
    use_store(monkeypatch, embedded)
    monkeypatch.delenv("DIMPLE_BROKER_URL", raising=False)
    get_settings.cache_clear()
    yield embedded
    get_settings.cache_clear()


# -- a run end to end ----------------------------------------------------------------------------
@pytest.mark.slow  # ranx compiles its functions on first call, per id width: 20-45 s on a fresh install
def test_eval_writes_a_run_that_ranx_scores_the_same(cli_env, tmp_path, capsys):
    from ranx import Qrels, Run, evaluate

    queries, qrels = _queries_and_qrels(tmp_path)
    out = tmp_path / "out"
    assert main(["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(out), "--name", "base",
                 "--no-progress", "--batch-size", "3"]) == 0
    folder = out / "base"
    for name in ("run.trec", "qrels.trec", "report.json", "summary.md", "metrics.png", "latency.png", "per_query.png"):
        assert (folder / name).is_file() and (folder / name).stat().st_size > 0, name
    report = json.loads((folder / "report.json").read_text())
    assert report["answered"] == report["queries"] == len(TOPICS)
    # ranx's own evaluation of the written files gives the report's figures
    theirs = evaluate(Qrels.from_file(str(folder / "qrels.trec"), kind="trec"),
                      Run.from_file(str(folder / "run.trec"), kind="trec"), list(ev.METRICS))
    for m in ev.METRICS:
        assert report["metrics"][m] == pytest.approx(float(theirs[m]), abs=1e-6), m
    # the run file holds what search serves, in order
    from workers.api import search

    first = search(f"{TOPICS[0]} item-0-0", namespace="code", max_units=100)
    assert ev.read_trec_run(folder / "run.trec")["q0"] == [r.id for r in first.results]
    assert 0 < report["metrics"]["recall@50"] <= 1
    assert {"embed", "fulltext", "descend", "fuse", "total"} <= set(report["latency_ms"])
    assert report["latency_ms"]["total"]["n"] == len(TOPICS)
    assert "queries/s" in (folder / "summary.md").read_text()


def test_compare_finds_the_better_run_and_reports_rank_changes(cli_env, tmp_path, capsys):
    queries, qrels = _queries_and_qrels(tmp_path)
    out = tmp_path / "out"
    common = ["--queries", str(queries), "--qrels", str(qrels), "--out", str(out), "--no-progress"]
    assert main(["eval", *common, "--name", "kw", "--mode", "keyword"]) == 0
    assert main(["eval", *common, "--name", "sem", "--mode", "semantic"]) == 0
    assert main(["eval", "compare", str(out / "sem"), str(out / "kw"), "--out", str(out), "--name", "c"]) == 0
    c = json.loads((out / "c" / "compare.json").read_text())
    kw = json.loads((out / "kw" / "report.json").read_text())
    sem = json.loads((out / "sem" / "report.json").read_text())
    assert c["runs"] == ["sem", "kw"]
    assert c["metrics"]["kw"]["ndcg@10"] == pytest.approx(kw["metrics"]["ndcg@10"], abs=1e-6)
    pair = c["pairs"][0]
    deltas = {q: kw["per_query"][q]["ndcg@10"] - sem["per_query"][q]["ndcg@10"] for q in kw["per_query"]}
    assert pair["mean_delta"] == pytest.approx(sum(deltas.values()) / len(deltas), abs=1e-5)
    assert [g["id"] for g in pair["gained"]] == [q for q, d in sorted(deltas.items(), key=lambda x: (-x[1], x[0])) if d > 0][:10]
    assert 0 <= pair["p_values"]["ndcg@10"] <= 1
    assert 0 <= pair["rank_changes"]["mean_overlap"] < 1  # keyword and semantic lists differ
    for name in ("compare.md", "metrics_by_run.png", "per_query_delta.png", "latency_by_run.png"):
        assert (out / "c" / name).stat().st_size > 0
    # same seed, same p-values
    assert main(["eval", "compare", str(out / "sem"), str(out / "kw"), "--out", str(out), "--name", "c2"]) == 0
    assert json.loads((out / "c2" / "compare.json").read_text())["pairs"][0]["p_values"] == pair["p_values"]


# -- replay ------------------------------------------------------------------------------------
def test_replay_reports_the_queries_a_settings_change_changed(cli_env, tmp_path, monkeypatch):
    from workers import audit
    from workers.api import search_many
    from workers.settings import get_settings

    asks = [{"query": f"{topic} {extra}", "max_units": 10}
            for topic in TOPICS for extra in ("note", "item-1-2 detail", "about")]
    served = search_many(asks)
    assert audit.flush(30)
    out = tmp_path / "out"
    # nothing changed: nothing reported
    assert main(["eval", "replay", "--from-audit", "--out", str(out), "--name", "same", "--no-progress"]) == 0
    same = json.loads((out / "same" / "replay.json").read_text())
    assert same["replayed"] == len(asks) and same["changed"] == 0 and same["mean_overlap"] == 1.0

    # a deliberate change: the vector leg's share of the convex fusion almost nothing
    monkeypatch.setenv("DIMPLE_CONVEX_ALPHA", "0.05")
    get_settings.cache_clear()
    assert main(["eval", "replay", "--from-audit", "--out", str(out), "--name", "changed", "--no-progress"]) == 0
    report = json.loads((out / "changed" / "replay.json").read_text())
    # what changed, found independently: each query re-run with the new weights
    import workers

    workers.configure(cli_env.replace(convex_alpha=0.05, audit_enabled=False))
    now = search_many(asks)
    expected = {r.query_id for r, n in zip(served, now) if [x.id for x in r.results] != [x.id for x in n.results]}
    assert expected, "the change should move some lists"
    assert {row["query_id"] for row in report["changed_queries"]} == expected
    assert report["changed"] == len(expected) and report["unchanged"] == len(asks) - len(expected)
    row = report["changed_queries"][0]
    assert row["changes"] and row["overlap"] == min(r["overlap"] for r in report["changed_queries"])
    assert (out / "changed" / "replay.md").read_text().count("overlap@10") >= 1


def test_replay_says_when_a_change_comes_from_writes_made_since(cli_env, tmp_path):
    from workers import audit
    from workers.api import forget, remember, search

    served = search(f"{TOPICS[0]} note", max_units=10)
    assert served.store_version is not None and served.results
    assert audit.flush(30)
    out = tmp_path / "out"
    assert main(["eval", "replay", "--from-audit", "--out", str(out), "--name", "before", "--no-progress"]) == 0
    before = json.loads((out / "before" / "replay.json").read_text())
    assert before["changed"] == 0 and before["changed_after_writes"] == 0
    top = served.results[0].id
    done = forget([top])
    remember({"namespace": "code", "content": f"{TOPICS[0]} note written later"})
    assert search(f"{TOPICS[0]} note", max_units=10).store_version >= done.version > served.store_version
    assert main(["eval", "replay", "--from-audit", "--out", str(out), "--name", "after", "--no-progress"]) == 0
    after = json.loads((out / "after" / "replay.json").read_text())
    row = next(r for r in after["changed_queries"] if r["query_id"] == served.query_id)
    assert row["store_changed"].startswith(f"the store changed since: version {served.store_version} then")
    assert after["changed_after_writes"] >= 1


def test_replay_since_filters_rows(cli_env, tmp_path):
    from workers import audit
    from workers.api import search

    search("deploy window")
    assert audit.flush(30)
    out = tmp_path / "out"
    assert main(["eval", "replay", "--from-audit", "--since", "2999-01-01", "--out", str(out)]) == 2
    assert main(["eval", "replay", "--from-audit", "--since", "1000000d", "--out", str(out)]) == 2  # was a traceback
    assert main(["eval", "replay", "--from-audit", "--since", "1h", "--out", str(out), "--name", "r",
                 "--no-progress"]) == 0
    assert json.loads((out / "r" / "replay.json").read_text())["rows"] == 1


# -- sweep -------------------------------------------------------------------------------------
def test_sweep_runs_each_configuration_without_touching_the_store(cli_env, tmp_path):
    from tests.stores import published

    queries, qrels = _queries_and_qrels(tmp_path)
    before = published(cli_env)
    out = tmp_path / "out"
    assert main(["eval", "sweep", "--queries", str(queries), "--qrels", str(qrels), "--out", str(out), "--name", "s",
                 "--modes", "keyword,hybrid", "--max-leaf-items", "4,64", "--no-progress"]) == 0
    c = json.loads((out / "s" / "compare.json").read_text())
    assert c["runs"] == ["mode=keyword,max_leaf_items=4", "mode=keyword,max_leaf_items=64",
                         "mode=hybrid,max_leaf_items=4", "mode=hybrid,max_leaf_items=64"]
    # keyword mode never uses the tree: the leaf size cannot change its figures
    assert c["metrics"][c["runs"][0]] == c["metrics"][c["runs"][1]]
    reports = {n: json.loads((out / "s" / n / "report.json").read_text()) for n in c["runs"]}
    assert reports[c["runs"][2]]["config"]["tree"]["max_leaf_items"] == 4
    assert published(cli_env) == before


# -- bad inputs: exit 2, one line, the report says what was skipped ------------------------------
def _err_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("lines,expected", [
    (['{"id": "q1", "query": "x"}', '{"id": "q2", "query": "y", "mode": "fuzzy"}'], "queries.jsonl line 2: mode: unknown mode"),
    (['{"id": "q1", "query": "x"}', "", '{"id": "q3", "query": "y"'], "queries.jsonl line 3: not valid JSON"),
    (['{"query": "x"}'], "queries.jsonl line 1: id: required"),
    (['{"id": "q1"}'], "queries.jsonl line 1: query: required"),
    (['{"id": "q1", "query": "x", "namespce": "code"}'], "queries.jsonl line 1: namespce: unknown field"),
    (['{"id": "q1", "query": "x", "max_units": 0}'], "queries.jsonl line 1: max_units:"),
    (['{"id": "q1", "query": "x"}', '{"id": "q1", "query": "y"}'], "queries.jsonl line 2: id: duplicate of line 1"),
    (['{"id": "q 1", "query": "x"}'], "queries.jsonl line 1: id: 'q 1' contains whitespace"),
    (['{"id": "q1", "query": "x", "options": [1]}'], "queries.jsonl line 1: options: must be a JSON object"),
    ([], "queries: the query set is empty"),
    (['{"id": "q1", "query": "x"}', '{"id": "q2", "query": "y", "namespace": "nope"}'],
     "queries.jsonl query 'q2': namespace: no namespace 'nope' in the store; it holds "),
])
def test_bad_query_files_are_one_line_exit_2(cli_env, tmp_path, capsys, lines, expected):
    queries = _write(tmp_path / "queries.jsonl", lines)
    qrels = _write(tmp_path / "qrels.trec", ["q1 0 m0-0 1"])
    assert main(["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(tmp_path / "o")]) == 2
    assert expected in _err_line(capsys)


@pytest.mark.parametrize("lines,expected", [
    (["q0 0 m0-0 1", "q1 0 m1-0"], "qrels.trec line 2: relevance: 'm1-0' is not an integer grade"),  # 3 columns: BEIR
    (["q0 0 m0-0 high"], "qrels.trec line 1: relevance: 'high' is not an integer grade"),
    (["q0 0 m0-0 1 extra"], "qrels.trec line 1: 5 columns; expected 4 (TREC"),
    (["q0 m0-0"], "qrels.trec line 1: 2 columns"),
    (["nobody 0 m0-0 1"], "no query of the set has a relevant judgment: nothing to evaluate (1 judged query id(s) "
                          "are not in the query set, e.g. 'nobody'; the set's ids are e.g. 'q0')"),
    (["q0 0 m0-0 2.7"], "qrels.trec line 1: relevance: '2.7' is not an integer grade"),
    (["q0 0 m0-0 inf"], "qrels.trec line 1: relevance: 'inf' is not an integer grade"),
])
def test_bad_qrels_are_one_line_exit_2(cli_env, tmp_path, capsys, lines, expected):
    queries, _ = _queries_and_qrels(tmp_path)
    qrels = _write(tmp_path / "qrels.trec", lines)
    assert main(["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(tmp_path / "o")]) == 2
    assert expected in _err_line(capsys)


def test_query_and_qrels_files_that_are_not_utf8_are_one_line_exit_2(cli_env, tmp_path, capsys):
    """Was: a UnicodeDecodeError traceback, exit 1."""
    queries, qrels = _queries_and_qrels(tmp_path)
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes('{"id": "q1", "query": "caf\u00e9"}\n'.encode("latin-1"))
    assert main(["eval", "--queries", str(latin), "--qrels", str(qrels), "--out", str(tmp_path / "o")]) == 2
    assert "latin1.jsonl: not UTF-8 text" in _err_line(capsys)
    latin.write_bytes("q0 0 caf\u00e9 1\n".encode("latin-1"))
    assert main(["eval", "--queries", str(queries), "--qrels", str(latin), "--out", str(tmp_path / "o")]) == 2
    assert "latin1.jsonl: not UTF-8 text" in _err_line(capsys)


def test_unknown_and_unjudged_queries_are_skipped_and_reported(cli_env, tmp_path, capsys):
    queries, qrels = _queries_and_qrels(tmp_path)
    lines = qrels.read_text().splitlines()
    kept = [l for l in lines if not l.startswith("q7 ")] + ["ghost 0 m0-0 1", "q6x 0 m0-0 1"]
    _write(qrels, [l for l in kept if not l.startswith("q6 ")] + ["q6 0 m6-0 0"])
    out = tmp_path / "out"
    assert main(["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(out), "--name", "r",
                 "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "qrels for unknown queries: 2" in err and "queries without judgments: 1" in err
    report = json.loads((out / "r" / "report.json").read_text())
    assert report["skipped"] == {
        "qrels_for_unknown_queries": {"count": 2, "ids": ["ghost", "q6x"]},
        "queries_without_judgments": {"count": 1, "ids": ["q7"]},
        "queries_without_relevant": {"count": 1, "ids": ["q6"]},
    }
    assert report["queries"] == len(TOPICS) - 2 and set(report["per_query"]) == {f"q{i}" for i in range(6)}
    assert "skipped, queries without judgments: 1 (q7)" in (out / "r" / "summary.md").read_text()
    # --strict turns them into errors
    assert main(["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(out), "--strict"]) == 2
    assert "judged query id(s) not in the query set" in _err_line(capsys)


def test_missing_source_or_out_is_exit_2(cli_env, tmp_path, capsys):
    assert main(["eval", "--out", str(tmp_path)]) == 2
    assert "give exactly one of" in _err_line(capsys)
    assert main(["eval", "--demo"]) == 2
    assert "--out: required" in _err_line(capsys)
    assert main(["eval", "compare", str(tmp_path / "nope"), str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "is not a run folder" in _err_line(capsys)
    assert main(["eval", "sweep", "--demo", "--out", str(tmp_path), "--weights", "1:x"]) == 2
    assert "--weights" in _err_line(capsys)
    queries, qrels = _queries_and_qrels(tmp_path)
    assert main(["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(tmp_path), "--in-flight", "0"]) == 2
    assert "--in-flight: must be at least 1" in _err_line(capsys)


# -- dataset sources: stores of their own -------------------------------------------------------
def test_beir_folder_is_ingested_into_its_own_store(cli_env, tmp_path, capsys):
    folder = tmp_path / "tiny-beir"
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": f"Title {i}", "text": f"{TOPICS[i]} paper number {i}"} for i in range(len(TOPICS))]
    write_jsonl(folder / "corpus.jsonl", docs)
    write_jsonl(folder / "queries.jsonl", [{"_id": f"b{i}", "text": f"{TOPICS[i]} paper"} for i in range(4)])
    _write(folder / "qrels" / "test.tsv", ["query-id\tcorpus-id\tscore"] + [f"b{i}\td{i}\t1" for i in range(3)])
    out = tmp_path / "out"
    store = tmp_path / "beir-store"
    assert main(["eval", "--beir", str(folder), "--store", str(store), "--out", str(out), "--name", "b",
                 "--mode", "keyword", "--no-progress"]) == 0
    report = json.loads((out / "b" / "report.json").read_text())
    assert report["queries"] == 3 and report["skipped"]["queries_without_judgments"]["ids"] == ["b3"]
    assert report["metrics"]["mrr@10"] == 1.0  # each title is its query
    assert report["config"]["data_dir"] == str(store)
    from pipeline.store.lake.follow import reader_for
    from pipeline.store.stats import store_stats

    reader = reader_for(cli_env.apart(store))
    try:
        snap = reader.snapshot()
        assert store_stats(snap.store, snap.overlay)["memories"] == len(TOPICS)
    finally:
        reader.close()
    # the corpus changes: the next run updates the store (a new document, one gone) instead of using it as it was
    capsys.readouterr()
    write_jsonl(folder / "corpus.jsonl", docs[1:] + [{"_id": "d-new", "text": "zygote quasar paper"}])
    write_jsonl(folder / "queries.jsonl", [{"_id": "b1", "text": f"{TOPICS[1]} paper"},
                                           {"_id": "bn", "text": "zygote quasar"}])
    _write(folder / "qrels" / "test.tsv", ["b1\td1\t1", "bn\td-new\t1"])
    assert main(["eval", "--beir", str(folder), "--store", str(store), "--out", str(out), "--name", "b2",
                 "--mode", "keyword", "--no-progress"]) == 0
    assert "set changed since its store" in capsys.readouterr().err
    assert json.loads((out / "b2" / "report.json").read_text())["metrics"]["mrr@10"] == 1.0
    from workers import resources

    resources.current().close_store()
    reader = reader_for(cli_env.apart(store))
    try:
        snap = reader.snapshot()
        assert store_stats(snap.store, snap.overlay)["memories"] == len(TOPICS)  # one in, one out
        assert "d0" in snap.overlay.forgotten and "d-new" in snap.overlay.members
    finally:
        reader.close()
    (folder / "qrels" / "test.tsv").unlink()
    assert main(["eval", "--beir", str(folder), "--out", str(out)]) == 2
    assert "missing qrels/test.tsv" in _err_line(capsys)
    _write(folder / "qrels" / "test.tsv", ["b1\td1\t1"])
    write_jsonl(folder / "corpus.jsonl", [{"_id": "d1", "text": 5}])
    assert main(["eval", "--beir", str(folder), "--out", str(out)]) == 2
    assert "corpus.jsonl line 1: text: must be a string, not 5" in _err_line(capsys)


def test_locomo_file_runs_with_the_loader_protocol(cli_env, tmp_path):
    from tests.unit.test_locomo import _fixture

    path = tmp_path / "loco.json"
    path.write_text(json.dumps(_fixture()), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["eval", "--locomo", str(path), "--store", str(tmp_path / "ls"), "--out", str(out), "--name", "l",
                 "--no-progress"]) == 0
    from pipeline.datasets.locomo import load_locomo

    loco = load_locomo(path)
    report = json.loads((out / "l" / "report.json").read_text())
    assert set(report["per_query"]) == set(loco.qrels)
    assert {k.removeprefix("locomo_"): v["count"] for k, v in report["skipped"].items()} == \
        {k: v for k, v in loco.skipped.items() if v}


def test_demo_set_runs_in_a_store_of_its_own_with_the_demo_figures(cli_env, tmp_path):
    from workers.cli.demo import build_demo_store, demo_settings, load_queries
    from workers.settings import WorkerSettings

    out = tmp_path / "out"
    assert main(["eval", "--demo", "--out", str(out), "--name", "d", "--no-progress"]) == 0
    report = json.loads((out / "d" / "report.json").read_text())
    settings = demo_settings(WorkerSettings(data_dir=cli_env.data_dir, embedding_model="hash-64", _env_file=None))
    queries, qrels = load_queries(build_demo_store(settings))  # the store eval built, reused
    assert report["answered"] == report["queries"] == len([q for q in queries if q["id"] in qrels])
    assert 0 < report["metrics"]["ndcg@10"] <= 1
    assert (cli_env.data_dir / "demo").is_dir()


def test_whole_grades_written_as_decimals_read_as_integers(tmp_path):
    from pipeline.evaluation import read_qrels

    path = _write(tmp_path / "qrels.trec", ["q0 0 m0-0 1.0", "q0 0 m0-1 2", "q1 0 m1-0 0.0"])
    assert read_qrels(path) == {"q0": {"m0-0": 1, "m0-1": 2}, "q1": {"m1-0": 0}}


@pytest.mark.parametrize("argv,expected", [
    (["sweep", "--modes", "keyword,keyword"], "--modes: 'keyword' is given twice"),
    (["sweep", "--rrf-k", "60,10,60"], "--rrf-k: 60 is given twice"),
    (["sweep", "--rrf-k", "60,x"], "--rrf-k: 'x' is not an integer"),
    (["--mode", "all", "--max-p", "5"], "--max-p: must be a p-value above 0 and at most 1, not 5"),
    (["--mode", "all", "--max-p", "0"], "--max-p: must be a p-value above 0 and at most 1, not 0"),
])
def test_bad_eval_options_are_refused_before_any_run(cli_env, tmp_path, capsys, argv, expected):
    queries, qrels = _queries_and_qrels(tmp_path)
    out = tmp_path / "out"
    head, rest = (argv[:1], argv[1:]) if argv[0] == "sweep" else ([], argv)
    assert main(["eval", *head, "--queries", str(queries), "--qrels", str(qrels), "--out", str(out), *rest]) == 2
    assert expected in _err_line(capsys)
    assert not out.exists()  # nothing run, nothing half-written


@pytest.mark.parametrize("option,expected", [(["-k", "0"], "-k: must be at least 1"),
                                             (["--max-p", "-1"], "--max-p: must be a p-value above 0")])
def test_bad_compare_options_are_refused(cli_env, tmp_path, capsys, option, expected):
    queries, qrels = _queries_and_qrels(tmp_path)
    out = tmp_path / "out"
    for name in ("a", "b"):
        assert main(["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(out), "--name", name,
                     "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", "compare", str(out / "a"), str(out / "b"), "--out", str(tmp_path / "cmp"), *option]) == 2
    assert expected in _err_line(capsys)
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize("body,expected", [
    ("{}", "--locomo: not a LoCoMo file: it holds no conversation turn"),
    ("[{}]", "--locomo: not a LoCoMo file: a conversation has no 'sample_id' field"),
])
def test_a_file_that_is_not_locomo_is_refused_before_any_store_is_built(cli_env, tmp_path, capsys, body, expected):
    path = tmp_path / "not-locomo.json"
    path.write_text(body, encoding="utf-8")
    store = tmp_path / "locomo-store"
    assert main(["eval", "--locomo", str(path), "--store", str(store), "--out", str(tmp_path / "o")]) == 2
    assert expected in _err_line(capsys)
    assert not store.exists()


def test_a_max_units_under_the_metrics_cut_offs_is_said(cli_env, tmp_path, capsys):
    queries, qrels = _queries_and_qrels(tmp_path)
    assert main(["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(tmp_path / "o"),
                 "--max-units", "5", "--no-progress"]) == 0
    assert ("--max-units 5 serves fewer results than ndcg@10, recall@10, recall@50, mrr@10, precision@10 read; "
            "those figures count "
            "the first 5 only") in capsys.readouterr().err


def test_dataset_evals_run_embedded_on_their_own_store_when_a_broker_is_set(cli_env, tmp_path, monkeypatch, capsys):
    """The demo set's store is built here: through a broker (here one that
    answers nothing) the workers' store would be queried and score zero. The
    run stays embedded, says so, and scores the demo set as without a broker."""
    from workers.settings import get_settings

    monkeypatch.setenv("DIMPLE_BROKER_URL", "redis://127.0.0.1:1/0")
    get_settings.cache_clear()
    out = tmp_path / "out"
    assert main(["eval", "--demo", "--out", str(out), "--name", "d", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "eval --demo runs embedded, in this process, on the store in" in err
    assert "DIMPLE_BROKER_URL is not used" in err
    report = json.loads((out / "d" / "report.json").read_text())
    assert report["config"]["via"] == "embedded" and report["answered"] == report["queries"]
    assert 0 < report["metrics"]["ndcg@10"] <= 1


def test_logged_eval_traffic_is_marked_and_never_replayed(cli_env, tmp_path, capsys):
    """``dimple eval --audit`` logs its queries (as the workers always do),
    marked ``eval``; a replay of the log re-runs the caller's query only."""
    from workers import audit
    from workers.api import search

    queries, qrels = _queries_and_qrels(tmp_path)
    out = tmp_path / "out"
    assert main(["eval", "--queries", str(queries), "--qrels", str(qrels), "--out", str(out), "--name", "a",
                 "--audit", "--no-progress"]) == 0
    caller = search(f"{TOPICS[0]} note", max_units=10)
    assert audit.flush(30)
    from pipeline import audit as pa

    rows = pa.since(pa.log_of(cli_env))
    assert sorted(r.options["origin"] for r in rows) == ["eval"] * len(TOPICS) + ["query"]
    capsys.readouterr()
    assert main(["eval", "replay", "--from-audit", "--out", str(out), "--name", "r", "--no-progress"]) == 0
    report = json.loads((out / "r" / "replay.json").read_text())
    assert report["rows"] == len(TOPICS) + 1 and report["replayed"] == 1 and report["unchanged"] == 1
    assert report["skipped"]["evaluation_traffic"]["count"] == len(TOPICS)
    assert caller.query_id not in report["skipped"]["evaluation_traffic"]["ids"]
    assert f"skipped evaluation traffic: {len(TOPICS)}" in capsys.readouterr().err
