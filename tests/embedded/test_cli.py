"""The ``dimple`` command line as a new user meets it (issue 13, "The first hour"):
quiet by default, the same message for a missing store everywhere, a closed
pipe, id prefixes, help text for every option, start-up off the query clock.
"""

from __future__ import annotations

import json
import logging
from contextlib import closing
from pathlib import Path

import pytest

from tests.conftest import use_store, write_jsonl
from workers.cli import main


def _mem(i: int, ns: str = "alpha", **extra) -> dict:
    return {"id": f"m{i}", "namespace": ns, "content": f"note {i} about billing and deploy window db-{i}", **extra}


@pytest.fixture
def cli_env(settings, monkeypatch):
    """The CLI pointed at ``settings`` through the environment, as a user runs it."""
    import workers
    from workers import audit, resources
    from workers.settings import get_settings

    use_store(monkeypatch, settings)
    get_settings.cache_clear()
    workers.configure(get_settings())
    root, celery = logging.getLogger(), logging.getLogger("celery")
    levels = root.level, celery.level
    yield get_settings()
    audit.flush()
    resources.current().close_store()
    root.setLevel(levels[0])
    celery.setLevel(levels[1])
    get_settings.cache_clear()


@pytest.fixture
def cli_store(cli_env, tmp_path):
    """A small store (two namespaces) in the CLI's data dir."""
    recs = [_mem(i, ns="alpha" if i % 2 else "beta") for i in range(20)]
    assert main(["ingest", str(write_jsonl(tmp_path / "m.jsonl", recs))]) == 0
    return cli_env


# -- 1: quiet by default, -v before or after the subcommand -------------------------------------
def test_search_prints_no_log_lines_unless_verbose(cli_store, capsys):
    capsys.readouterr()
    assert main(["search", "billing"]) == 0
    out, err = capsys.readouterr()
    assert "m1" in out and err == ""
    for argv in (["-v", "search", "billing"], ["search", "billing", "-v"], ["search", "-v", "billing"]):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "INFO dimple.search hybrid.search query_id=" in err, argv
        assert "celery" not in err  # Celery's per-task lines stay out of a person's terminal


def test_worker_logs_at_dimple_log_level_and_v_lowers_it(monkeypatch):
    from workers.cli.commands import worker_argv
    from workers.cli.common import log_level
    from workers.settings import WorkerSettings

    s = WorkerSettings(_env_file=None)
    assert s.log_level == "INFO" and log_level(0, s.log_level) == logging.INFO  # a worker's log is for operators
    assert log_level(0) == logging.WARNING and log_level(1) == logging.INFO and log_level(2) == logging.DEBUG
    assert log_level(1, "ERROR") == logging.INFO and log_level(0, "DEBUG") == logging.DEBUG
    assert WorkerSettings(_env_file=None, log_level="debug").log_level == "DEBUG"
    argv = worker_argv(s, "search", None, None)
    assert argv[argv.index("--loglevel") + 1] == "INFO"


def test_a_worker_with_a_negative_concurrency_is_refused_before_it_starts():
    """Celery refuses ``-c -1`` at each start (exit 2), and the supervisor
    restarted it forever. ``dimple worker`` builds the worker's command line,
    and refuses it naming the flag, before it supervises anything."""
    from pipeline.errors import InputError
    from workers.cli.commands import worker_argv
    from workers.settings import WorkerSettings

    with pytest.raises(InputError) as refused:
        worker_argv(WorkerSettings(_env_file=None), "search", -1, None)
    assert refused.value.field == "--concurrency"


def test_celery_task_lines_stay_out_of_every_log_but_debug(cli_env):
    """Celery's per-task INFO lines carry whole batches (query text, memories):
    muted for commands and for ``dimple worker`` alike, shown at DEBUG."""
    from workers.cli.common import setup_logging

    for argv, level in ((["stats"], logging.WARNING), (["worker"], logging.INFO)):  # worker: no broker, exit 2
        assert main(argv) == 2
        assert logging.getLogger().level == level
        assert logging.getLogger("celery.app.trace").getEffectiveLevel() == logging.WARNING
    setup_logging(logging.DEBUG)
    assert logging.getLogger("celery.app.trace").getEffectiveLevel() == logging.DEBUG


def test_bad_log_level_is_a_user_error(cli_env, monkeypatch, capsys):
    from workers.settings import get_settings

    monkeypatch.setenv("DIMPLE_LOG_LEVEL", "chatty")
    get_settings.cache_clear()
    assert main(["config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dimple: error: setting log_level: must be one of CRITICAL, ERROR, WARNING, INFO, DEBUG"]


# -- 2: no store, unknown namespace: one message, exit 2, before any model -------------------------
def test_search_and_stats_without_a_store_say_the_same_true_thing(cli_env, monkeypatch, capsys):
    import pipeline.embedders
    from workers.cli.demo import demo_settings

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded for a data dir without a store")

    monkeypatch.setattr(pipeline.embedders, "make_embedder", no_model)
    demo_dir = demo_settings(cli_env).data_dir
    messages = []
    for argv in (["search", "billing"], ["stats"], ["reindex"], ["search", "billing", "--json"]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1
        messages.append(err)
    assert len(set(messages)) == 1
    assert f"no store in {cli_env.data_dir}" in messages[0]
    assert f"DIMPLE_DATA_DIR={demo_dir}" in messages[0] and "'dimple ingest FILE'" in messages[0]


def test_the_hint_points_at_an_existing_demo_store(cli_env, tmp_path, capsys):
    from workers.cli.common import ingest_file
    from workers.cli.demo import demo_settings

    demo = demo_settings(cli_env)
    ingest_file(write_jsonl(tmp_path / "d.jsonl", [_mem(1)]), demo, progress=False)
    assert main(["search", "billing"]) == 2
    err = capsys.readouterr().err
    assert f"search the demo's with DIMPLE_DATA_DIR={demo.data_dir}" in err and "'dimple demo' to build" not in err
    # a user's lake elsewhere (a PostgreSQL catalog, a shared data path) never holds the demo's store
    shared = cli_env.replace(store={**cli_env.store.model_dump(), "catalog": "postgres:dbname=dimple host=db",
                                    "data_path": str(tmp_path / "shared"), "index_path": str(tmp_path / "bases")})
    apart = demo_settings(shared)
    assert (apart.lake_catalog, apart.lake_data_path, apart.lake_index_path) == (
        f"sqlite:{demo.data_dir / 'lake.sqlite'}", demo.data_dir / "lake", demo.data_dir / "indexes")


def test_an_unknown_namespace_is_a_user_error_naming_the_ones_there(cli_store, capsys):
    capsys.readouterr()
    assert main(["search", "billing", "--namespace", "gamma"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        "dimple: error: --namespace: no namespace 'gamma' in the store; it holds 'alpha', 'beta'"
    ]
    assert main(["search", "billing", "--namespace", "beta", "--json"]) == 0


def test_an_unknown_content_type_is_a_user_error_naming_the_ones_there(cli_store, tmp_path, capsys):
    """As an unknown namespace: a scope on a type the store does not hold could only answer nothing."""
    assert main(["ingest", str(write_jsonl(tmp_path / "n.jsonl", [_mem(99, content_type="decision")]))]) == 0
    capsys.readouterr()
    assert main(["search", "billing", "--content-type", "text", "--content-type", "notes"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        "dimple: error: --content-type: no content type 'notes' in the store; it holds 'decision', 'text'"
    ]
    assert main(["search", "billing", "--content-type", "decision", "--json"]) == 0  # a type held in a delta only


def test_a_budget_that_cuts_everything_says_so_not_no_results(cli_store, capsys):
    capsys.readouterr()
    assert main(["search", "billing", "--max-chars", "3"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("no results for 'billing' (hybrid): the maxChars budget (limit 3) cut all ")


def test_a_keyword_query_of_stopwords_gets_a_hint(cli_store, capsys):
    capsys.readouterr()
    assert main(["search", "the second one", "--mode", "keyword"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("no results for 'the second one' (keyword)")
    assert "hint: every word of 'the second one' is a stopword (DIMPLE_FULLTEXT__STOPWORDS=english)" in out.err
    assert main(["search", "zzyzxqv", "--mode", "keyword"]) == 0  # a term nothing holds: no results, no hint
    out = capsys.readouterr()
    assert out.out.startswith("no results for 'zzyzxqv'") and "hint:" not in out.err


def test_many_namespaces_are_not_all_listed():
    from pipeline.errors import InputError
    from workers.cli.common import check_namespace

    check_namespace(["a"], None)
    check_namespace(["a"], "a")
    with pytest.raises(InputError, match=r"'n00', .* 'n09' and 5 more \('dimple stats' lists them\)"):
        check_namespace([f"n{i:02d}" for i in range(15)], "x")


# -- 4: a reader that closes early ------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["stats"], ["search", "billing", "--json"], ["audit", "tail"], ["--help"]])
def test_a_closed_stdout_ends_quietly(cli_store, argv):
    """``dimple stats | head``: the reader is gone before dimple writes; no
    traceback, exit 141 (128 + SIGPIPE, as a shell reports a tool the signal
    ends; argparse's --help swallows the error itself and exits 0)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from workers import audit

    assert main(["search", "billing"]) == 0  # an audit row for 'audit tail'
    assert audit.flush()  # written before another process reads the log (the writer batches up to a second)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "workers.cli", *argv], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader closes before the first byte is written
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == (0 if argv == ["--help"] else 141)
    assert err == ""


# -- 5: audit show / explain take a unique prefix of the id --------------------------------------
def test_audit_show_and_explain_take_a_unique_prefix(cli_store, capsys):
    import json

    from workers import audit

    capsys.readouterr()
    assert main(["search", "billing", "--json"]) == 0
    query_id = json.loads(capsys.readouterr().out)["query_id"]
    audit.flush()
    assert main(["audit", "show", query_id[:8]]) == 0
    assert json.loads(capsys.readouterr().out)["query_id"] == query_id
    assert main(["audit", "explain", query_id[:8], "--no-replay"]) == 0
    assert capsys.readouterr().out.startswith(f"query {query_id} ")
    assert main(["audit", "show", query_id[:3]]) == 2
    assert "too short" in capsys.readouterr().err


# -- 6: explain's replay is not logged -----------------------------------------------------------
def test_audit_explain_replays_without_writing_an_audit_row(cli_store, capsys):
    import json

    from pipeline import audit as rows
    from workers import audit, resources

    capsys.readouterr()
    assert main(["search", "billing", "--json"]) == 0
    query_id = json.loads(capsys.readouterr().out)["query_id"]
    audit.flush()
    before = rows.count(rows.log_of(cli_store))
    assert main(["audit", "explain", query_id]) == 0
    assert "replay now: same list" in capsys.readouterr().out
    assert main(["audit", "explain", query_id, "--json"]) == 0
    replay = json.loads(capsys.readouterr().out)["replay"]
    assert replay["verdict"] == "same list" and replay["logged_as"] is None
    audit.flush()
    assert rows.count(rows.log_of(cli_store)) == before == (1, 1)
    assert rows.get(rows.log_of(cli_store), replay["replay_query_id"]) is None
    assert resources.current().settings().audit_enabled  # searches after it are logged again
    assert main(["search", "deploy"]) == 0
    audit.flush()
    assert rows.count(rows.log_of(cli_store)) == (2, 2)


# -- 7: every option says what it does ----------------------------------------------------------------
def test_every_option_of_every_command_has_help_text():
    import argparse

    from workers.cli.commands import _parser, all_parsers

    parsers = all_parsers(_parser())
    assert {p.prog for p in parsers} >= {"dimple search", "dimple audit tail", "dimple eval sweep", "dimple worker"}
    missing = [
        f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        for p in parsers
        for a in p._actions
        if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        and (not a.help or a.help == argparse.SUPPRESS)
    ]
    assert missing == []


def test_search_takes_top_k_and_weights(cli_store, capsys):
    import json

    capsys.readouterr()
    assert main(["search", "billing", "--weights", "0:1", "--top-k", "3", "--max-units", "50", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["mode"] == "keyword" and res["legs"]["fts"]["hits"] == 3 and not res["legs"]["vector"]["ran"]
    assert len(res["results"]) == 3
    assert main(["search", "billing", "--mode", "keyword", "--weights", "1:1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "hybrid"  # weights override the mode's
    for bad, says in ((["--weights", "1:x"], "--weights: '1:x' is not VECTOR:FTS"),
                      (["--weights", "0:0"], "not both 0"),
                      (["--weights", "2000:1"], "weights.vector"),
                      (["--top-k", "0"], "top_k")):
        assert main(["search", "billing", *bad]) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], (bad, err)


# -- 8: an identical file changes nothing -------------------------------------------------------------
def test_reingesting_an_identical_file_says_so_and_publishes_nothing(cli_env, tmp_path, capsys):
    from tests.stores import published

    path = write_jsonl(tmp_path / "m.jsonl", [_mem(i) for i in range(8)])
    assert main(["ingest", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"ingested {path}: 8 new, 0 updated, 0 unchanged, 8 embedded in ")
    before = published(cli_env)
    assert main(["ingest", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"ingested {path}: 0 new, 0 updated, 8 unchanged, 0 embedded in " in out
    assert out.rstrip().endswith(f"; nothing to write, store version {before[0]} kept")
    assert published(cli_env) == before  # the same snapshot and data files


# -- 10: start-up off the query's clock; nothing heavy imported ----------------------------------------
def test_model_loading_is_not_counted_in_a_cli_search(cli_store, monkeypatch, capsys):
    """The embedder (here one that takes 2 s to load) is loaded before the
    query's clock starts: neither the embed stage, total_ms nor the audit row count it."""
    import json
    import time

    import pipeline.embedders
    from pipeline import audit as rows
    from pipeline.embedders import HashEmbedder
    from workers import audit, resources

    loads = []

    def slow_model(settings, bulk=False):
        loads.append(bulk)
        time.sleep(2.0)
        return HashEmbedder(64)

    monkeypatch.setattr(resources.current(), "_embedders", {})
    monkeypatch.setattr(pipeline.embedders, "make_embedder", slow_model)
    monkeypatch.setattr(resources, "make_embedder", slow_model, raising=False)
    resources.current().close_store()
    capsys.readouterr()
    assert main(["search", "billing", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert loads == [False]  # the query embedder, loaded once
    assert res["timings"]["embed"] < 1000 and res["total_ms"] < 1500, res["timings"]
    audit.flush()
    row = rows.get(rows.log_of(cli_store), res["query_id"])
    assert row.total_ms < 1500 and row.latency_ms["embed"] < 1000


def test_keyword_search_loads_no_model(cli_store, monkeypatch):
    import pipeline.embedders
    from workers import resources

    def no_model(*args, **kwargs):
        raise AssertionError("a keyword search loaded a model")

    monkeypatch.setattr(resources.current(), "_embedders", {})
    monkeypatch.setattr(pipeline.embedders, "make_embedder", no_model)
    monkeypatch.setattr(resources, "make_embedder", no_model, raising=False)
    assert main(["search", "billing", "--mode", "keyword"]) == 0


def test_a_search_process_imports_nothing_heavy(cli_store, tmp_path):
    """A ``dimple search`` process never imports eval's libraries (ranx,
    numba, matplotlib, tqdm), torch, transformers, or pandas (which DuckDB
    would import for its parameters)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    report = tmp_path / "modules.json"
    script = ("import json, sys; from workers.cli import main; code = main(); "
              f"open({str(report)!r}, 'w').write(json.dumps([k for k, v in sys.modules.items() if v is not None])); "
              "sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", script, "search", "billing"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "m1" in proc.stdout, proc.stderr[-2000:]
    imported = {name.partition(".")[0] for name in json.loads(report.read_text())}
    assert {"workers", "duckdb", "celery", "numpy"} <= imported
    heavy = {"ranx", "numba", "matplotlib", "tqdm", "pandas", "torch", "transformers", "sentence_transformers"}
    assert heavy & imported == set()


# -- 5: an embedding model or device that cannot be loaded --------------------------------------------
def written(data: Path) -> bool:
    """Whether a store in ``data`` holds anything: a lake with its tables (an
    empty DuckLake catalog, which attaching creates, holds nothing of the user's)."""
    import sqlite3

    catalog = data / "lake.sqlite"
    if catalog.exists():  # read by a process that never attached it (no second SQLite user of its locks)
        with closing(sqlite3.connect(f"file:{catalog}?mode=ro", uri=True)) as con:
            return bool(con.execute("SELECT count(*) FROM ducklake_table").fetchone()[0])
    return False


@pytest.mark.parametrize("env,expected", [
    ({"DIMPLE_EMBEDDING_DEVICE": "foo"}, "dimple: error: setting embedding_device: 'foo': Expected one of cpu"),
    ({"DIMPLE_EMBEDDING_MODEL": "{tmp}/no-model-here"}, "dimple: error: setting embedding_model: cannot load "),
])
def test_a_model_that_cannot_be_loaded_is_one_line_naming_the_setting(tmp_path, env, expected):
    """A user's setting, not a crash: no traceback, exit 2, nothing written."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    memories = tmp_path / "m.jsonl"
    memories.write_text('{"id": "a", "namespace": "n", "content": "hello"}\n', encoding="utf-8")
    base = {k: v for k, v in os.environ.items() if not k.startswith("DIMPLE_")}
    done = subprocess.run([sys.executable, "-m", "workers.cli", "ingest", str(memories)], cwd=root, capture_output=True,
                          text=True, timeout=300, env={**base, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1",
                                                       "DIMPLE_DATA_DIR": str(tmp_path / "data"),
                                                       **{k: v.format(tmp=tmp_path) for k, v in env.items()}})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(expected)
    assert not written(tmp_path / "data")


def test_ingest_reads_standard_input_for_a_dash(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    lines = "".join(json.dumps({"id": f"s{i}", "namespace": "stdin", "content": f"piped memory {i}"}) + "\n"
                    for i in range(3))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIMPLE_")}
    env.update({"PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1", "DIMPLE_DATA_DIR": str(tmp_path / "data"),
                "DIMPLE_EMBEDDING_MODEL": "hash-32"})
    done = subprocess.run([sys.executable, "-m", "workers.cli", "ingest", "-"], cwd=root, input="\ufeff" + lines,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ingested standard input: 3 new, 0 updated, 0 unchanged"), done.stdout
    listed = subprocess.run([sys.executable, "-m", "workers.cli", "search", "piped memory", "--mode", "keyword",
                             "--json"], cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert listed.returncode == 0, listed.stderr
    assert sorted(r["id"] for r in json.loads(listed.stdout)["results"]) == ["s0", "s1", "s2"]


def test_ingest_errors_print_a_files_control_characters_as_escapes(cli_env, tmp_path, capsys):
    """A field name comes from the file: an escape sequence or a line break in
    it is printed escaped, one line per error (was: raw, so a file could colour
    the terminal or forge a line of the report)."""
    path = tmp_path / "hostile.jsonl"
    path.write_text(json.dumps({"id": "a", "namespace": "n", "content": "c", "x\x1b[31mRED\nforged": 1}) + "\n",
                    encoding="utf-8")
    assert main(["ingest", str(path)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[31mRED\\nforged" in err
    assert err.splitlines() == ["dimple: 1 invalid line(s); nothing was written", err.splitlines()[1]]
