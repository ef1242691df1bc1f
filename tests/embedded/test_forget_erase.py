"""Forget must erase (issue 30): a forgotten memory is gone from results and
links at once, and after the ``dimple compact`` that finds its forget due
(``store.erase_within``; made due here by ageing it), plus ``dimple audit
purge`` and the erase after it for the audit trail, no file under the data
dir holds its text or its id. More of the lake's erase is tested in
``test_lake_compaction`` and ``tests/unit/test_lake*``."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from pipeline import audit as pa
from pipeline.errors import InputError
from pipeline.store.database import utcnow
from pipeline.store.lake import Lake
from pipeline.store.lake import erase as erasing
from pipeline.store.lake.follow import Follower, reader_for
from pipeline.store.maintenance import compact
from pipeline.store.stats import store_stats
from pipeline.store.writes import get, parse_records, write
from tests.conftest import store_settings, write_jsonl
from tests.embedded.test_cli import cli_env  # noqa: F401 (a fixture)
from tests.lakes import age_files, age_forgets, compact_erasing, pass_the_wait
from workers.cli import main
from workers.cli.render import format_compacted

SECRET_ID = "forgettable-q7zx"
TOKEN = "ZEBRAQUOKKA91"
WORDS = "deploy window backup restore cache latency queue worker broker vault rotation schema index".split()


def _others(n: int, ns: str) -> list[dict]:
    rng = random.Random(ns)
    return [{"id": f"{ns}-{i}", "namespace": ns, "content": " ".join(rng.choice(WORDS) for _ in range(8))}
            for i in range(n)]


def traces(root: Path, *needles: str) -> list[str]:
    """Every file under ``root`` whose bytes hold one of ``needles`` (ignoring ASCII case)."""
    wanted = [n.lower().encode() for n in needles]
    return sorted(f"{p.relative_to(root)}: {n.decode()}" for p in root.rglob("*") if p.is_file()
                  for n in wanted if n in p.read_bytes().lower())


def _compact_erasing(settings, capsys, *options: str) -> str:
    """What ``dimple compact [options]`` printed, with an erase due. Should a
    DuckLake crash have killed one of its tries, and the files it left made
    the erase wait (``test_an_erase_waits_for_files_a_compaction_that_died_left``),
    it says so, and runs again once the wait has passed."""
    capsys.readouterr()
    assert main(["compact", *options]) == 0
    out = capsys.readouterr().out
    if pass_the_wait(settings):
        assert "the erase waits for files a compaction or a write that died left" in out, out
        assert main(["compact", *options]) == 0
        out = capsys.readouterr().out
    return out


def _stats(capsys) -> dict:
    capsys.readouterr()
    assert main(["stats", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _stats_edges(capsys) -> dict:
    return _stats(capsys)["edges"]


def _topic_keys(settings) -> list[str]:
    reader = reader_for(settings)
    try:
        return [r[0] for r in reader.snapshot().store.con.execute("SELECT topic_key FROM topics").fetchall()]
    finally:
        reader.close()




def test_one_compaction_and_a_purge_leave_no_trace_of_a_forgotten_memory_in_any_file(cli_env, tmp_path, capsys):
    from workers import api
    from workers import audit as worker_audit

    # in a namespace of its own with one other memory: the tree labels their
    # leaf with the token (a topic key is made of its members' typical words)
    secret = {"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"}
    door = {"id": "door", "namespace": "vault", "content": "it opens"}
    backed = {"id": "backed", "namespace": "ops", "content": "vault rotation is monthly", "supported_by": [SECRET_ID]}
    assert main(["ingest", str(write_jsonl(tmp_path / "m.jsonl",
                                           [secret, door, backed, *_others(30, "ops"), *_others(20, "home")]))]) == 0
    assert any(TOKEN.lower() in key for key in _topic_keys(cli_env))
    # the text written again (rewritten), and a link to it from a later memory
    api.remember({**secret, "content": f"{TOKEN} opens it, rotated monthly"})
    api.remember({"id": "successor", "namespace": "vault", "content": "the vault code changed",
                  "supersedes": [SECRET_ID]})
    assert SECRET_ID in {r.id for r in api.search(TOKEN, mode="keyword").results}  # the audit log holds both
    assert SECRET_ID in {r.id for r in api.search("opens", mode="hybrid").results}
    assert SECRET_ID not in {r.id for r in api.search("backup restore", mode="keyword").results}  # a row that stays
    assert _stats_edges(capsys) == {"supersedes": 1, "supports": 1}
    assert traces(cli_env.data_dir, TOKEN)  # the scan sees what it looks for

    assert api.forget([SECRET_ID], reason="user asked").forgotten == 1
    # at once: no link to it, no edge counted, no result
    linked = {m["id"]: m for m in api.get(["successor", "backed"])}
    assert linked["successor"]["supersedes"] == [] and linked["backed"]["supported_by"] == []
    assert _stats_edges(capsys) == {}
    assert api.search(TOKEN, mode="keyword").results == []
    # listed for the erase (dimple stats says so, and from when it is due)
    erase = _stats(capsys)["erase"]
    assert erase["waiting"] == 1 and erase["held_until"] is None
    assert datetime.fromisoformat(erase["due_from"]) - datetime.fromisoformat(erase["oldest"]) == \
        cli_env.store.erase_within * 0.9
    capsys.readouterr()
    assert main(["stats"]) == 0
    assert "forgets     1 waiting to be erased from every file" in capsys.readouterr().out

    age_forgets(cli_env)
    out = _compact_erasing(cli_env, capsys)
    assert "1 forget(s) erased" in out, out
    assert worker_audit.flush()
    assert main(["audit", "purge", SECRET_ID, "--text", TOKEN]) == 0
    assert "purged 3 audit row(s)" in capsys.readouterr().out  # the two that served it, the one that quoted it
    # the purged rows' bytes stay in the lake's files until the next erase, as a forget's do
    age_forgets(cli_env)
    out = _compact_erasing(cli_env, capsys)
    assert "1 forget(s) erased" in out, out

    assert traces(cli_env.data_dir, TOKEN, SECRET_ID) == []
    # the store and the log still work, and the log kept the rows that never saw it
    assert {m["id"] for m in api.get(["successor", "backed"])} == {"successor", "backed"}
    assert api.search("opens", mode="hybrid").results
    assert worker_audit.flush()
    assert [r.query_text for r in pa.tail(pa.log_of(cli_env), 10)] == ["backup restore", "opens"]
    capsys.readouterr()
    assert main(["compact"]) == 0  # a second one, with nothing to do
    assert capsys.readouterr().out.startswith("nothing to compact")
    assert _stats(capsys)["erase"]["waiting"] == 0
    assert main(["stats"]) == 0
    assert "forgets     none waiting to be erased" in capsys.readouterr().out


def test_compact_erase_erases_a_forget_at_once_however_recent(cli_env, tmp_path, capsys):
    """``dimple compact`` erases the forgets due (0.9 of ``erase_within`` old);
    ``dimple compact --erase`` erases every forget waiting now: a secret
    written by mistake need not wait out the hour."""
    secret = {"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"}
    assert main(["ingest", str(write_jsonl(tmp_path / "m.jsonl", [secret, *_others(20, "ops")]))]) == 0
    assert main(["forget", SECRET_ID]) == 0
    capsys.readouterr()
    assert main(["compact"]) == 0  # not due: its bytes stay for time travel
    out = capsys.readouterr().out
    assert out.startswith("compacted the lake") and "erased" not in out, out
    assert traces(cli_env.data_dir, TOKEN)
    assert _stats(capsys)["erase"]["waiting"] == 1

    out = _compact_erasing(cli_env, capsys, "--erase")
    assert "1 forget(s) erased from every file and the catalog" in out, out
    assert traces(cli_env.data_dir, TOKEN, SECRET_ID) == []
    assert _stats(capsys)["erase"]["waiting"] == 0
    capsys.readouterr()
    assert main(["compact", "--erase"]) == 0  # nothing waiting: nothing to erase, nothing written
    assert capsys.readouterr().out.startswith("nothing to compact")


def _settings_store(settings):
    recs = [{"id": SECRET_ID, "namespace": "ops", "content": f"the vault code is {TOKEN}"},
            {"id": "keep", "namespace": "ops", "content": "backups run nightly"}, *_others(20, "ops")]
    write(settings, parse_records(recs, settings))  # the base
    write(settings, parse_records([{"id": "later", "namespace": "ops", "content": f"{TOKEN} again",
                                    "supersedes": [SECRET_ID]}], settings))


def test_stats_count_only_edges_whose_ends_are_both_live(settings):
    _settings_store(settings)
    reader = reader_for(settings)
    snap = reader.snapshot()
    assert store_stats(snap.store, snap.overlay)["edges"] == {"supersedes": 1}
    reader.close()
    write(settings, forget=[SECRET_ID])
    reader = reader_for(settings)
    snap = reader.snapshot()
    assert store_stats(snap.store, snap.overlay)["edges"] == {}
    reader.close()


def _row(qid: str, text: str, served: list[str]) -> pa.AuditRecord:
    return pa.AuditRecord.model_validate({
        "query_id": qid, "logged_at": "2026-12-02T10:00:00", "query_hash": "0" * 16, "hash_of": "text",
        "mode": "keyword", "requested_mode": "keyword", "query_text": text, "options": {}, "query_profile": {},
        "sources": [{"id": m} for m in served], "result_count": len(served), "truncated": False,
        "truncation": None, "latency_ms": {}, "total_ms": 1.0, "rrf_k": 60})


def _audit_log(tmp_path):
    """A lake holding one memory (its record tables: a purge is listed for the
    erase as a forget is), and its audit log, outbox and dead letters."""
    settings = store_settings(tmp_path)
    write(settings, parse_records({"id": "keep", "namespace": "ops", "content": "backups run nightly"}, settings))
    return settings, pa.log_of(settings), settings.audit_outbox_dir, settings.dead_letter_dir


def test_audit_purge_clears_log_outbox_and_dead_letters_and_the_log_stays_whole(tmp_path):
    from pipeline.audit.letters import dead_letter, outbox_put

    settings, log, outbox, letters = _audit_log(tmp_path)
    kept, served, quoted = _row("q-kept", "backups", ["keep"]), _row("q-served", "vault", [SECRET_ID, "keep"]), \
        _row("q-quoted", f"what is {TOKEN.lower()}", [])
    assert pa.write_records(log, [kept, served, quoted]) == 3
    box = outbox / outbox_put(outbox, [served.model_dump(mode="json"), kept.model_dump(mode="json")])
    dead_letter(letters, quoted, "gave up")
    dead_letter(letters, _row("q-other", "cache", []), "gave up")
    # what a process killed between writing a file's .tmp and renaming it left, an hour ago
    left = outbox / "00000000000000000001-dead.json.tmp"
    left.write_text(json.dumps({"records": [served.model_dump(mode="json")]}))
    os.utime(left, (time.time() - 3600, time.time() - 3600))

    with pytest.raises(InputError, match="ids"):
        pa.purge(log, outbox, letters, [])
    done = pa.purge(log, outbox, letters, [SECRET_ID], [TOKEN])
    assert (done.rows, done.outbox_rows, done.dead_letters) == (2, 1, 2)
    assert not left.exists()
    assert traces(outbox, TOKEN, SECRET_ID) == [] and traces(letters, TOKEN, SECRET_ID) == []  # at once
    # the rows' bytes stay in the lake's files until the next erase, as a forget's do
    pa.lake.release(log)
    age_forgets(settings)
    assert compact_erasing(settings).forgotten == 1
    assert traces(tmp_path, TOKEN, SECRET_ID) == []
    assert [r["query_id"] for r in json.loads(box.read_text())["records"]] == ["q-kept"]
    assert [p.name for p in letters.glob("*.json")] == ["q-other.json"]
    assert [r.query_id for r in pa.tail(log, 10)] == ["q-kept"]
    assert pa.write_records(log, [kept, _row("q-new", "later", [])]) == 1  # the key still holds
    assert pa.purge(log, outbox, letters, [SECRET_ID]).rows == 0
    pa.lake.release(log)


def test_audit_purge_takes_an_id_whole_and_never_matches_query_ids(tmp_path):
    """``purge m1`` removes the rows that served m1, not those that served m10,
    and a short id never matches the uuid of a row's own query id."""
    _, log, outbox, letters = _audit_log(tmp_path)
    rows = [_row("7f00aa7b", "about m1", ["m1"]), _row("77777777", "another", ["m10", "m2"]),
            _row("a7a7a7a7", "deploy", ["m3"])]
    assert pa.write_records(log, rows) == 3
    assert pa.purge(log, outbox, letters, ["m1"]).rows == 1
    assert [r.query_id for r in pa.tail(log, 10)] == ["a7a7a7a7", "77777777"]
    assert pa.purge(log, outbox, letters, ["7"]).rows == 0  # in every query id, in no field
    assert pa.purge(log, outbox, letters, [], ["id", "mode"]).rows == 0  # keys of the rows, in none of their values
    assert pa.purge(log, outbox, letters, [], ["DEPLOY"]).rows == 1  # a text, ignoring case
    assert [r.query_id for r in pa.tail(log, 10)] == ["77777777"]
    pa.lake.release(log)


def test_audit_purge_reads_only_the_rows_that_may_hold_a_needle_and_misses_none(tmp_path, monkeypatch):
    """The log is searched in SQL first, so a purge does not read every row of
    a log that grows with every query; a needle the stored JSON may spell
    otherwise (non-ASCII, a quote: escaped there) reads every row, and each
    row read is checked whole, so none is missed or taken wrongly."""
    import importlib

    purging = importlib.import_module("pipeline.audit.purge")  # the module (the package exports its function)
    _, log, outbox, letters = _audit_log(tmp_path)
    rows = [_row("q-plain", "about the vault", ["m1"]), _row("q-other", "backups", ["m2"]),
            _row("q-cafe", "le café", ["m-é"]), _row("q-quote", 'say "open"', ["m3"])]
    rows[1].options = {"note": "the VAULT is closed"}  # in a JSON column, another case
    assert pa.write_records(log, rows) == 4
    read: list[int] = []
    real = purging._row_data
    monkeypatch.setattr(purging, "_row_data", lambda row: read.append(1) or real(row))
    assert pa.purge(log, outbox, letters, ["m1"]).rows == 1 and len(read) == 1
    read.clear()
    assert pa.purge(log, outbox, letters, [], ["Vault"]).rows == 1 and len(read) == 1  # q-other's options
    read.clear()
    assert pa.purge(log, outbox, letters, ["m-é"]).rows == 1 and len(read) == 2  # every row left read
    assert pa.purge(log, outbox, letters, [], ['"open"']).rows == 1
    assert pa.tail(log, 10) == []
    pa.lake.release(log)


def test_an_erase_waits_for_files_a_compaction_that_died_left_and_then_completes(tmp_path):
    """A compaction that dies midway (DuckLake's maintenance calls crash now
    and then) leaves the files it wrote and never committed, and its flush
    writes a forgotten memory's inlined row too. Such a file is deleted only
    once an hour old (a younger one may be a write in progress). The erase
    after it says so and leaves the forget listed, and the next one, due once
    the file can go, deletes it and completes: no forget is called erased
    while a file holds its bytes. A file written after the dead compaction was
    found (a write in progress) neither holds the erase nor is deleted."""
    settings = store_settings(tmp_path)
    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   *_others(10, "ops")], settings))
    write(settings, forget=[SECRET_ID])
    # what a compaction killed inside its flush leaves: a Parquet file no commit
    # lists, holding the row, and its claim, held by a process of this host now gone
    folder = settings.lake_data_path / "main" / "memories"
    left, writing = folder / f"ducklake-{uuid.uuid4()}.parquet", folder / f"ducklake-{uuid.uuid4()}.parquet"
    duckdb.sql(f"COPY (SELECT '{SECRET_ID}' AS id, '{TOKEN} opens it' AS content) TO '{left}' (FORMAT parquet)")
    duckdb.sql(f"COPY (SELECT 'in-progress' AS id, 'a batch being written' AS content) TO '{writing}' "
               "(FORMAT parquet)")
    ahead = time.time() + 600  # written after the dead compaction is found, by more than the clock slack
    os.utime(writing, (ahead, ahead))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    with Lake.open(settings) as lake:
        lake.con.execute("UPDATE compaction_head SET holder = ?, claimed_at = ?",
                         [f"{socket.gethostname()}:{int(dead.stdout)}:deadbeef", utcnow()])
    age_forgets(settings)

    held = compact(settings, wait=True)
    assert held.ran and held.forgotten == 0 and held.erase_held_until is not None
    assert "the erase waits for files a compaction or a write that died left" in format_compacted(held)
    assert traces(tmp_path, TOKEN, SECRET_ID) == sorted(f"{left.relative_to(tmp_path)}: {n.lower()}"
                                                       for n in (SECRET_ID, TOKEN))
    until = datetime.fromisoformat(held.erase_held_until)
    follower = Follower(settings)  # what dimple stats shows
    try:
        state = follower.erase_state()
        assert state is not None and state.waiting == 1 and state.held_until is not None
        assert until - timedelta(seconds=1) < state.held_until <= until
    finally:
        follower.close()
    with Lake.open(settings) as lake:
        assert lake.con.execute("SELECT count(*) FROM forgets").fetchone() == (1,)  # not called erased
        # not due again until the file can be deleted (no erase a minute meanwhile)
        assert not erasing.erase_due(lake.con, settings.store.erase_within, utcnow())
        assert erasing.erase_due(lake.con, settings.store.erase_within, until)
    assert not compact(settings, wait=True).ran  # nothing written since, no erase due

    assert pass_the_wait(settings)  # the hour goes by
    done = compact(settings, wait=True)
    assert done.forgotten == 1 and done.erase_held_until is None
    assert traces(tmp_path, TOKEN, SECRET_ID) == []
    assert writing.is_file()  # a write in progress keeps its file
    with Lake.open(settings) as lake:
        assert lake.con.execute("SELECT count(*) FROM forgets").fetchone() == (0,)
        assert lake.con.execute("SELECT count(*) FROM dead_compactions").fetchone() == (0,)
    assert not pass_the_wait(settings)


_KILLED_BEFORE_COMMIT = """
import os, signal, sys
from pipeline.store.lake import commit
from pipeline.store.writes import parse_records, write
from tests.conftest import store_settings
from pathlib import Path

real = commit._apply

def apply_then_die(*args, **kwargs):  # the rows written (a Parquet file: over 10 of them), then killed
    real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)

commit._apply = apply_then_die
settings = store_settings(Path(sys.argv[1]))
write(settings, parse_records([{"id": sys.argv[2], "namespace": "vault", "content": sys.argv[3]},
                               *[{"id": f"ops{i}", "namespace": "ops", "content": f"runbook note {i}"}
                                 for i in range(12)]], settings))
"""


def test_an_erase_waits_for_files_a_write_that_died_left_and_then_completes(tmp_path):
    """A writer killed before its commit leaves the Parquet file of its batch,
    which no commit lists; the write sent again commits the same memory in a
    file of its own. Once that memory is forgotten, the erase must not call it
    erased while the dead writer's file, kept as a possible write in progress
    until an hour old, holds its bytes: it waits for it as for a dead
    compaction's, and the erase due once the file can go completes."""
    settings = store_settings(tmp_path)
    content = f"{TOKEN} opens it"
    write(settings, parse_records([{"id": "first", "namespace": "ops", "content": "the store exists"}], settings))
    killed = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_COMMIT, str(tmp_path), SECRET_ID, content],
                            capture_output=True, text=True, cwd=Path(__file__).parents[2], check=False)
    assert killed.returncode == -9, killed.stderr
    left = [p.split(": ")[0] for p in traces(tmp_path, TOKEN)]
    assert len(left) == 1 and left[0].endswith(".parquet"), left  # the dead batch's file
    # the write sent again, then the forget; then as if 55 minutes went by (an erase is due at 54)
    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": content}], settings))
    write(settings, forget=[SECRET_ID])
    age_forgets(settings, timedelta(minutes=55))
    age_files(settings, timedelta(minutes=55))

    held = compact(settings, wait=True)
    assert held.ran and held.forgotten == 0 and held.erase_held_until is not None
    holding = traces(tmp_path, TOKEN)
    with Lake.open(settings) as lake:
        assert lake.con.execute("SELECT count(*) FROM forgets").fetchone() == (1,)  # not called erased
        holders = [r[0] for r in lake.con.execute("SELECT holder FROM dead_compactions WHERE held").fetchall()]
        assert not erasing.erase_due(lake.con, settings.store.erase_within, utcnow())
    assert f"write:{tmp_path / left[0]}" in holders, holders
    until = datetime.fromisoformat(held.erase_held_until)
    assert utcnow() < until
    if holders == [f"write:{tmp_path / left[0]}"]:  # (a DuckLake crash in this compaction adds its own wait)
        assert holding == [f"{left[0]}: {TOKEN.lower()}"]  # only the dead writer's file holds it
        assert until <= utcnow() + timedelta(minutes=11)  # the file is 55 min old: an hour and 5 min

    assert pass_the_wait(settings)  # the hour goes by
    done = compact(settings, wait=True)
    assert done.forgotten == 1 and done.erase_held_until is None
    assert traces(tmp_path, TOKEN, SECRET_ID) == []
    with Lake.open(settings) as lake:
        assert lake.con.execute("SELECT count(*) FROM forgets").fetchone() == (0,)
        assert lake.con.execute("SELECT count(*) FROM dead_compactions").fetchone() == (0,)


def test_a_death_recorded_after_a_held_erase_makes_it_wait_again_instead_of_failing(tmp_path):
    """An erase held for a dead compaction, its wait over, and a compaction
    found dead since (a retry's claim records one after a DuckLake crash):
    the files no commit lists that are younger than that death may be its,
    or a write's in progress. The erase waits for them, as ``cut`` would;
    it does not call them an hour old and ask an operator to delete a live file."""
    settings = store_settings(tmp_path)
    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   *_others(10, "ops")], settings))
    write(settings, forget=[SECRET_ID])
    young = settings.lake_data_path / "main" / "memories" / f"ducklake-{uuid.uuid4()}.parquet"
    duckdb.sql(f"COPY (SELECT 'in-progress' AS id) TO '{young}' (FORMAT parquet)")  # no commit lists it
    long_ago = utcnow() - erasing.LONGEST_TRANSACTION - erasing.CLOCK_SLACK - timedelta(minutes=1)
    just = utcnow()
    with Lake.open(settings) as lake:
        lake.con.execute("INSERT INTO dead_compactions VALUES ('elsewhere:1:aa', ?, true)", [long_ago])
        lake.con.execute("INSERT INTO dead_compactions VALUES ('elsewhere:2:bb', ?, false)", [just])
        erasing.check_the_dead(lake.con, deadline_s=30)  # the wait runs from the newer death: not over
    age_forgets(settings)
    done = compact(settings, wait=True)
    assert done.forgotten == 0
    assert done.erase_held_until is not None
    assert datetime.fromisoformat(done.erase_held_until) >= just + erasing.LONGEST_TRANSACTION
    assert young.exists()
    with Lake.open(settings) as lake:
        assert lake.con.execute("SELECT count(*) FROM forgets").fetchone() == (1,)
        assert lake.con.execute("SELECT bool_and(held) FROM dead_compactions").fetchone() == (True,)


def test_with_a_relative_data_path_a_file_written_now_is_not_taken_for_one_past_the_wait(tmp_path, monkeypatch):
    """``store.data_path`` may be relative (to the working directory), and so are
    then the paths DuckLake lists. A file no commit lists that was written a
    moment ago (a write in progress) is young there as anywhere: an erase past
    a dead compaction's wait does not name it as left for an hour."""
    monkeypatch.chdir(tmp_path)
    settings = store_settings(tmp_path)
    settings = settings.replace(store=settings.store.model_copy(update={"data_path": Path("lake-files")}))
    write(settings, parse_records(_others(11, "ops"), settings))
    young = Path("lake-files") / "main" / "memories" / f"ducklake-{uuid.uuid4()}.parquet"
    duckdb.sql(f"COPY (SELECT 'in-progress' AS id) TO '{young}' (FORMAT parquet)")
    long_ago = utcnow() - erasing.LONGEST_TRANSACTION - erasing.CLOCK_SLACK - timedelta(minutes=1)
    with Lake.open(settings) as lake:
        assert any(not os.path.isabs(p) and p.endswith(young.name) for p in erasing._orphans(lake.con))
        lake.con.execute("INSERT INTO dead_compactions VALUES ('elsewhere:1:aa', ?, true)", [long_ago])
        erasing.check_the_dead(lake.con, deadline_s=30)  # the young file is not the dead one's
    assert young.exists()


@pytest.mark.parametrize("held", [True, False], ids=["held", "never-held"])
def test_an_erase_past_its_wait_that_finds_the_dead_ones_file_still_there_fails_naming_it(tmp_path, monkeypatch,
                                                                                          held):
    """Once the wait is over, step 4 should have deleted what a dead compaction
    left. A file still there (step 4 could not delete it: permissions, a clock
    ahead) is not waited for again, every minute: the erase fails naming it,
    and the forget stays listed; the compactions the checks start meanwhile
    fail at once, before any costly step. The same when no erase ever held
    for that death (the first erase after it came past the wait, and failed
    without holding)."""
    from pipeline.errors import StoreError
    from pipeline.store.lake.catalog import extensions_dir

    settings = store_settings(tmp_path)
    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   *_others(10, "ops")], settings))
    write(settings, forget=[SECRET_ID])
    left = settings.lake_data_path / "main" / "memories" / f"ducklake-{uuid.uuid4()}.parquet"
    duckdb.sql(f"COPY (SELECT '{SECRET_ID}' AS id, '{TOKEN} opens it' AS content) TO '{left}' (FORMAT parquet)")
    found = utcnow() - erasing.LONGEST_TRANSACTION - erasing.CLOCK_SLACK - timedelta(minutes=1)
    stamp = found.replace(tzinfo=UTC).timestamp() - 60
    os.utime(left, (stamp, stamp))
    real = erasing._step

    def step(con, deadline_s, sql, params=None, what="purge"):  # step 4 deletes no file no commit lists
        return 0 if "delete_orphaned_files" in sql else real(con, deadline_s, sql, params, what)

    monkeypatch.setattr(erasing, "_step", step)
    with Lake.open(settings) as lake:
        lake.con.execute("INSERT INTO dead_compactions VALUES ('elsewhere:1:aa', ?, ?)", [found, held])
        rewritten = erasing.rewrite(lake.con, deadline_s=30)
        with pytest.raises(StoreError, match=f"over 1:00:00 old and still there .*{left.name}"):
            erasing.cut(lake.con, lake.catalog, extensions_dir(settings), rewritten=rewritten,
                        keep=lake.latest_snapshot(), deadline_s=30)
        assert lake.con.execute("SELECT count(*) FROM forgets").fetchone() == (1,)

    # the erase stays due, and every check (a minute) compacts again: each fails before
    # rewriting a file or building a base, for what one listing finds
    from pipeline.store.lake.compaction import compact_lake

    def rewrite(*args, **kwargs):
        raise AssertionError("a whole erase ran for files it can only fail on")

    monkeypatch.setattr(erasing, "rewrite", rewrite)
    age_forgets(settings)
    with Lake.open(settings) as lake:
        assert erasing.erase_due(lake.con, settings.store.erase_within, utcnow())
        bases = lake.con.execute("SELECT count(*) FROM indexes").fetchone()
    with pytest.raises(StoreError, match=f"over 1:00:00 old and still there .*{left.name}"):
        compact_lake(settings, wait=True)
    with Lake.open(settings) as lake:
        assert lake.con.execute("SELECT count(*) FROM indexes").fetchone() == bases  # no base built
        assert lake.con.execute("SELECT count(*) FROM forgets").fetchone() == (1,)
        assert lake.con.execute("SELECT holder FROM compaction_head").fetchone() == (None,)  # given back


def test_an_erase_that_dies_before_dropping_the_old_bases_stays_due_and_the_next_one_finishes(settings, monkeypatch):
    """The forgets are marked erased only after the bases older than the new
    one (which hold the forgotten memory) are deleted: a compaction that dies
    between its cut and that leaves the erase due, so the next compaction
    deletes them. Marked first, a quiet lake kept the old base, listed, with
    the memory in it, and nothing due to ever remove it."""
    from pipeline.store.lake import compaction

    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   *_others(20, "ops")], settings))  # the lake's first base holds it
    write(settings, None, forget=[SECRET_ID])
    real = compaction._drop_bases

    def dies(*args, **kwargs):
        raise KeyboardInterrupt  # the process killed between the cut and the old bases' deletion

    monkeypatch.setattr(compaction, "_drop_bases", dies)
    with pytest.raises(KeyboardInterrupt):
        compaction.compact_lake(settings, erase=True)
    with Lake.open(settings) as lake:
        assert erasing.erase_state(lake.con).waiting == 1  # still due: the old base still holds it
    assert traces(settings.data_dir, TOKEN)

    monkeypatch.setattr(compaction, "_drop_bases", real)
    age_forgets(settings)
    report = compact_erasing(settings)
    assert report.forgotten == 1
    assert traces(settings.data_dir, TOKEN, SECRET_ID) == []
    with Lake.open(settings) as lake:
        assert erasing.erase_state(lake.con).waiting == 0


def test_a_base_built_from_a_snapshot_an_erase_expired_meanwhile_is_not_kept(settings, monkeypatch):
    """A base is read from its snapshot first and built for minutes after: an
    erase that cuts the history in between (and deletes the bases listed
    before it) must not find, once it is done, that base listed after it
    with the forgotten memory in it. The builder takes it back, file and
    listing, and says the snapshot expired."""
    from pipeline.store.lake import follow
    from pipeline.store.lake.compaction import compact_lake
    from pipeline.store.lake.read import Cut

    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   *_others(20, "ops")], settings))
    before = write(settings, parse_records([{"id": "note", "namespace": "ops", "content": "rotation done"}],
                                           settings)).version  # a snapshot with the secret, no base of its own
    write(settings, None, forget=[SECRET_ID])
    real, erased = follow.build_base, []

    def and_meanwhile_an_erase(lake, snapshot, work, settings_):
        real(lake, snapshot, work, settings_)  # read and built: the secret is in it
        if snapshot == before and not erased:  # another process's erase, done before the link (its build is real)
            erased.append(compact_lake(settings, erase=True).forgotten)

    monkeypatch.setattr(follow, "build_base", and_meanwhile_an_erase)
    builder = Follower(settings)
    try:
        with pytest.raises(Cut, match=f"snapshot {before} expired"):
            builder.build(before)
        assert erased == [1]
        assert before not in follow.listed(builder.lake())
    finally:
        builder.close()
    assert traces(settings.data_dir, TOKEN, SECRET_ID) == []


def test_an_erase_deletes_every_partial_base_of_a_snapshot_it_expired_whichever_host_built_it(settings):
    """A builder killed midway on another host leaves its partial base in the
    shared index path, and only that host can tell its builder died (the
    sweep waits ``STALE_BUILD_S`` for another host's). Built from a snapshot
    before the forget, it may hold the forgotten memory: the erase deletes
    every build of a snapshot it expired, since none can be listed any more.
    A build of a later snapshot (a live one, for all this host knows) stays."""
    from pipeline.store.lake.follow import index_dir

    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   *_others(20, "ops")], settings))
    before = write(settings, parse_records([{"id": "note", "namespace": "ops", "content": "rotation done"}],
                                           settings)).version
    write(settings, None, forget=[SECRET_ID])
    folder = index_dir(settings)
    left = folder / f".base-{before}.elsewhere.4242.1.duckdb.work"  # as a killed builder leaves it
    left.write_bytes(f"{SECRET_ID} {TOKEN} opens it".encode())
    later = folder / ".base-999999999.elsewhere.4243.1.duckdb"
    later.write_bytes(b"a live build elsewhere")
    age_forgets(settings)
    assert compact_erasing(settings).forgotten == 1
    assert not left.exists() and later.exists()
    assert traces(settings.data_dir, TOKEN, SECRET_ID) == []
    assert traces(folder, TOKEN, SECRET_ID) == []


def test_the_upkeep_check_deletes_a_partial_base_of_a_snapshot_the_lake_no_longer_holds(settings):
    """A builder that read its snapshot before an erase expired it, killed
    after the erase's own sweep, leaves a partial base the erase never saw:
    every ingest worker's upkeep check (``Follower.clear_cache``, once a
    minute) deletes the partial bases of snapshots the lake no longer holds,
    and only those."""
    from pipeline.store.lake.follow import index_dir

    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   *_others(20, "ops")], settings))
    before = write(settings, parse_records([{"id": "note", "namespace": "ops", "content": "rotation done"}],
                                           settings)).version
    write(settings, None, forget=[SECRET_ID])
    age_forgets(settings)
    assert compact_erasing(settings).forgotten == 1
    folder = index_dir(settings)
    left = folder / f".base-{before}.elsewhere.4242.1.duckdb.work"  # made after the erase's sweep
    left.write_bytes(f"{SECRET_ID} {TOKEN} opens it".encode())
    with Lake.open(settings) as lake:
        latest = lake.latest_snapshot()
    live = folder / f".base-{latest}.elsewhere.4243.1.duckdb"
    live.write_bytes(b"a live build elsewhere")
    follower = Follower(settings)
    try:
        follower.clear_cache()
    finally:
        follower.close()
    assert not left.exists() and live.exists()


def test_a_base_whose_snapshot_an_erase_expired_before_its_read_is_not_built(settings, monkeypatch):
    """The erase comes before the builder reads its snapshot: the read finds
    it gone, and the build ends as one whose snapshot expired (``Cut``), as
    when the erase comes during the build, not as a caller's bad ``as_of``."""
    from pipeline.store.lake import follow
    from pipeline.store.lake.compaction import compact_lake
    from pipeline.store.lake.read import Cut

    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   *_others(20, "ops")], settings))
    before = write(settings, parse_records([{"id": "note", "namespace": "ops", "content": "rotation done"}],
                                           settings)).version
    write(settings, None, forget=[SECRET_ID])
    real = follow.build_base

    def an_erase_first(lake, snapshot, work, settings_):
        compact_lake(settings, erase=True)  # another process's
        real(lake, snapshot, work, settings_)

    monkeypatch.setattr(follow, "build_base", an_erase_first)
    builder = Follower(settings)
    try:
        with pytest.raises(Cut, match=f"snapshot {before} expired"):
            builder.build(before)
    finally:
        builder.close()
    assert traces(settings.data_dir, TOKEN, SECRET_ID) == []


def test_a_write_whose_snapshot_an_erase_expires_before_its_base_is_built_stands(settings, monkeypatch):
    """A write large enough to be published as a base of its own commits, then
    builds: an erase that expires its snapshot first leaves the write standing
    (answered, its memories read through the erase's base), its base not built."""
    from pipeline.store.lake import follow
    from pipeline.store.lake.compaction import compact_lake

    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   *_others(5, "ops")], settings))
    write(settings, None, forget=[SECRET_ID])
    real, erased = follow.build_base, []

    def an_erase_first(lake, snapshot, work, settings_):
        if not erased:  # another process's erase, between the write's commit and its build (whose own build is real)
            monkeypatch.setattr(follow, "build_base", real)
            erased.append(compact_lake(settings, erase=True).forgotten)
        real(lake, snapshot, work, settings_)

    monkeypatch.setattr(follow, "build_base", an_erase_first)
    big = settings.replace(compact_delta_memories=3)  # a write of 3 is published as a base
    report = write(big, parse_records([{"id": f"big-{i}", "namespace": "ops", "content": f"batch note {i}"}
                                       for i in range(3)], big))
    assert erased == [1] and report.inserted == 3 and not report.compacted
    assert [m["id"] for m in get(settings, ["big-0", "big-1", "big-2"])] == ["big-0", "big-1", "big-2"]
    assert traces(settings.data_dir, TOKEN, SECRET_ID) == []

