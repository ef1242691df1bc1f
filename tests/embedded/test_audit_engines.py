"""The audit trail: the rows live in the lake's ``retrieval_log``
(docs/LAKE.md, "The audit trail on many hosts"), written one commit per
batch, exactly once by query id, read by ``dimple audit`` from any process,
purged from the lake with the bytes gone at the next erase.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from pipeline import audit as pa
from pipeline.audit.record import AuditRecord
from tests.conftest import store_settings
from tests.lakes import age_forgets, pass_the_wait

ROOT = Path(__file__).resolve().parents[2]


def _remember() -> int:
    from workers.api import remember

    return remember([{"id": f"m{i}", "namespace": "n", "content": f"note {i} on the deploy window db-{i}"}
                     for i in range(12)]).version


def _row(i: int, text: str = "a question") -> AuditRecord:
    return AuditRecord(query_id=f"{i:032x}", logged_at=datetime(2026, 12, 1, 0, 0, i % 60), query_hash="h",
                       hash_of="text", mode="keyword", requested_mode="keyword", query_text=f"{text} {i}",
                       options={"top_k": 3}, query_profile={"store_version": 1}, sources=[{"id": "m1", "rank": 1}],
                       result_count=1, truncated=False, latency_ms={"search.budget": 0.1}, total_ms=1.0, rrf_k=60)


def _audit_commits(settings) -> int:
    """Snapshots of the lake committed by audit batches."""
    from pipeline.store.lake.catalog import LAKE, attach

    con = attach(settings)[0]
    try:
        return con.execute(f"SELECT count(*) FROM ducklake_snapshots('{LAKE}') WHERE commit_message = 'audit'"
                           ).fetchone()[0]
    finally:
        con.close()


def _env(settings) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DIMPLE_DATA_DIR": str(settings.data_dir),
            "DIMPLE_EMBEDDING_MODEL": "hash-64", "DIMPLE_STORE__CATALOG": settings.lake_catalog,
            "DIMPLE_STORE__DATA_PATH": str(settings.lake_data_path)}


def test_every_query_is_logged_once_and_read_back(embedded):
    from workers import audit
    from workers.api import audit_row, search_many

    _remember()
    results = search_many([{"query": f"deploy window {i}", "mode": ("keyword", "hybrid")[i % 2]} for i in range(40)],
                          batch_size=10)
    assert audit.flush(60)
    log = pa.log_of(embedded)
    assert isinstance(log, pa.LakeLog)
    assert pa.count(log) == (40, 40)
    assert {r.query_id for r in pa.tail(log, 100)} == {r.query_id for r in results}
    first = results[0]
    row = audit_row(first.query_id[:8])  # by a prefix, as `dimple audit show` takes it
    assert row.query_id == first.query_id and [s["id"] for s in row.sources] == [r.id for r in first.results]
    assert not embedded.audit_path.exists()  # the lake keeps no audit file


def test_a_prefix_of_a_query_just_answered_is_not_taken_for_an_older_rows(embedded):
    """Embedded, a query's row waits up to a second for the writer: looking it
    up by a prefix an older row shares (a few thousand rows make that likely
    for four characters) finds both and names them, not the older one alone."""
    from pipeline.errors import InputError
    from workers import audit
    from workers.api import audit_row, search

    _remember()
    answered = search("deploy window")
    older = _row(0).model_copy(update={"query_id": answered.query_id[:4] + "0" * 28})
    assert pa.write_records(pa.log_of(embedded), [older]) == 1
    assert audit.pending()  # the answered query's row is still on its way
    with pytest.raises(InputError) as info:
        audit_row(answered.query_id[:4])
    assert answered.query_id in str(info.value) and older.query_id in str(info.value)
    assert audit_row(answered.query_id[:8]).query_id == answered.query_id


def test_a_row_written_twice_is_stored_once(embedded):
    log = pa.log_of(embedded)
    assert pa.write_records(log, [_row(i) for i in range(6)]) == 6
    assert pa.write_records(log, [_row(i) for i in range(4, 9)] + [_row(8)]) == 3  # 4, 5 again; 8 twice
    assert pa.write_records(log, [_row(1)]) == 0
    assert pa.count(log) == (9, 9)


def test_the_row_records_as_of_and_min_version_when_given(embedded):
    from workers import audit
    from workers.api import audit_row, explain, remember, search

    version = _remember()
    plain = search("deploy window", mode="keyword")
    waited = search("deploy window", mode="keyword", min_version=version)
    assert audit.flush(60)
    assert "as_of" not in audit_row(plain.query_id).options and "min_version" not in audit_row(plain.query_id).options
    assert audit_row(waited.query_id).options["min_version"] == version

    then = search("deploy window", mode="keyword", as_of=version)
    later = remember({"id": "late", "namespace": "n", "content": "deploy window deploy window deploy window"})
    assert later.version > version
    assert audit.flush(60)
    row = audit_row(then.query_id)
    assert row.options["as_of"] == version and row.query_profile["store_version"] == version
    replay = explain(then.query_id)["replay"]
    assert replay["replayed_at"] == version and replay["verdict"] == "same list"  # "late" leads now, not then
    assert search("deploy window", mode="keyword").results[0].id == "late"


def test_on_the_lake_a_batch_is_one_commit_and_nothing_new_commits_nothing(tmp_path):
    settings = store_settings(tmp_path)
    log = pa.log_of(settings)
    assert pa.write_records(log, [_row(i) for i in range(50)]) == 50
    assert _audit_commits(settings) == 1
    assert pa.write_records(log, [_row(i) for i in range(50)]) == 0
    assert _audit_commits(settings) == 1
    assert pa.write_records(log, [_row(i) for i in range(45, 60)]) == 10
    assert _audit_commits(settings) == 2
    pa.lake.release(log)


def test_on_the_lake_a_reader_passes_over_audit_commits_and_takes_the_next_write(tmp_path, monkeypatch):
    """Every query's audit row commits a lake snapshot: a search process
    following the store keeps its view through them (no changes read, no
    overlay rebuilt, the version it answers with unchanged) and takes the next
    memory write as before."""
    from pipeline.store.lake import follow
    from pipeline.store.lake.follow import reader_for
    from pipeline.store.writes import parse_records, write

    settings = store_settings(tmp_path)
    first = write(settings, parse_records([{"id": "a", "namespace": "n", "content": "alpha"}], settings))
    reader = reader_for(settings)
    log = pa.log_of(settings)
    try:
        held = reader.snapshot(fresh=True)
        assert held is not None and held.version == first.version
        read: list[int] = []
        real = follow.deltas_since
        monkeypatch.setattr(follow, "deltas_since", lambda changes, *a, **k: read.append(1) or real(changes, *a, **k))
        for i in range(3):
            assert pa.write_records(log, [_row(i)]) == 1
            assert reader.snapshot(fresh=True) is held  # the same view: nothing rebuilt
        assert read == [] and _audit_commits(settings) == 3
        # a min_version naming the last audit commit is reached by the same view, at once
        assert reader.at_least(first.version + 3, 0.0) is held
        second = write(settings, parse_records([{"id": "b", "namespace": "n", "content": "beta"}], settings),
                       reader=reader)
        now = reader.snapshot(fresh=True)
        assert now is not held and now.version == second.version > first.version + 3 and read == [1]
        assert "b" in now.overlay.members
    finally:
        pa.lake.release(log)
        reader.close()


def test_on_the_lake_the_embedded_writer_commits_per_batch_not_per_row(embedded):
    from workers import audit
    from workers.api import search

    _remember()
    for i in range(20):
        search(f"deploy window {i}", mode="keyword")
    assert audit.flush(60)
    assert pa.count(pa.log_of(embedded)) == (20, 20)
    assert _audit_commits(embedded) <= 4  # lingering up to a second for the rows behind: not 20 commits


_WRITER = textwrap.dedent("""
    import json, sys, time
    from datetime import datetime
    from pipeline import audit as pa
    from pipeline.audit.record import AuditRecord
    from workers.settings import get_settings
    settings = get_settings()
    me, start = sys.argv[1], float(sys.argv[2])
    def row(qid):
        return AuditRecord(query_id=qid, logged_at=datetime(2026, 12, 1), query_hash="h", hash_of="text",
                           mode="keyword", requested_mode="keyword", query_text="q " + qid, options={},
                           query_profile={}, sources=[], result_count=0, truncated=False, total_ms=1.0, rrf_k=60)
    log = pa.log_of(settings)
    pa.lake.check_writable(log)  # attached and ready before the start, so the batches meet
    time.sleep(max(0.0, start - time.time()))
    inserted = 0
    for b in range(8):
        # five rows of its own and three that the other process sends too (a redelivered message)
        batch = [row(f"{me}-{b}-{i}") for i in range(5)] + [row(f"shared-{b}-{i}") for i in range(3)]
        inserted += pa.write_records(log, batch)
    print(json.dumps({"inserted": inserted}))
""")


def writers_at_once(settings, tmp_path: Path, names: tuple[str, ...]) -> None:
    """``names`` processes each write 8 batches of 5 rows of their own and 3
    that every process sends, starting together: every row is stored once,
    each shared row inserted by exactly one of them."""
    import time

    start = time.time() + 3.0 * len(names)  # all attached (a second or two each) before any writes
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, me, str(start)], cwd=tmp_path, env=_env(settings),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for me in names]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    expected = 8 * 5 * len(names) + 8 * 3
    log = pa.log_of(settings)
    assert pa.count(log) == (expected, expected)
    assert sum(o["inserted"] for o in outs) == expected  # each shared row inserted by one of them
    ids = {r.query_id for r in pa.since(log)}
    assert {f"shared-{b}-{i}" for b in range(8) for i in range(3)} <= ids
    pa.lake.release(log)


def test_on_the_lake_two_processes_writing_at_once_store_every_row_once(tmp_path):
    writers_at_once(store_settings(tmp_path), tmp_path, ("a", "b"))


def test_dimple_audit_tail_in_another_process_sees_this_process_rows(embedded):
    from workers import audit
    from workers.api import search

    _remember()
    asked = [search(f"deploy window {i}", mode="keyword").query_id for i in range(3)]
    assert audit.flush(60)
    done = subprocess.run([sys.executable, "-m", "workers.cli", "audit", "tail", "-n", "5", "--json"],
                          cwd=embedded.data_dir.parent, env=_env(embedded), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["query_id"] for line in done.stdout.splitlines()] == asked


def test_purge_removes_the_rows_and_on_the_lake_the_next_erase_takes_their_bytes(embedded, capsys, monkeypatch):
    from workers import audit
    from workers.api import search
    from workers.cli import main
    from workers.settings import get_settings

    for name, value in _env(embedded).items():
        if name.startswith("DIMPLE_"):
            monkeypatch.setenv(name, value)
    get_settings.cache_clear()

    _remember()
    secret = "zebracorn"
    kept = search("deploy window", mode="keyword").query_id
    gone = search(f"{secret} deploy window", mode="keyword").query_id
    assert audit.flush(60)
    log = pa.log_of(embedded)
    try:
        assert main(["audit", "purge", "--text", secret]) == 0
    finally:
        get_settings.cache_clear()
    assert f"purged 1 audit row(s) from {log}" in capsys.readouterr().out
    assert pa.get(log, gone) is None and pa.get(log, kept) is not None and pa.count(log) == (1, 1)
    from pipeline.store.database import utcnow
    from pipeline.store.lake import Lake, erase

    def holding() -> list[Path]:
        roots = [embedded.data_dir, embedded.lake_data_path]
        return sorted({p for root in roots for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()})

    assert holding()  # deleted, not yet erased: older snapshots still read the row
    from workers import resources

    resources.current().close_store()
    pa.lake.release(log)
    # listed for the erase as a forget is: due once as old as store.erase_within (the default, an hour)
    with Lake.open(embedded) as lake:
        assert lake.con.execute("SELECT count(*) FROM forgets").fetchone() == (1,)
        assert not erase.erase_due(lake.con, embedded.store.erase_within, utcnow())
    age_forgets(embedded)
    done = subprocess.run([sys.executable, "-m", "workers.cli", "compact"], cwd=embedded.data_dir.parent,
                          env=_env(embedded), capture_output=True, text=True, timeout=300)
    if pass_the_wait(embedded):  # a DuckLake crash left files its erase waited for: said, and run again
        assert "the erase waits for files a compaction or a write that died left" in done.stdout, done.stdout
        done = subprocess.run([sys.executable, "-m", "workers.cli", "compact"], cwd=embedded.data_dir.parent,
                              env=_env(embedded), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "1 forget(s) erased" in done.stdout, done.stdout
    assert holding() == []
    assert pa.get(log, kept) is not None and pa.get(log, gone) is None


def test_a_query_before_any_memory_is_logged_and_the_first_write_still_creates_the_store(embedded):
    """On the lake the audit writer may create its tables before any memory
    is written (the record tables need the embedding dimension): the first
    write then creates the rest, and both queries' rows are there."""
    from workers import audit
    from workers.api import remember, search

    before = search("deploy window", mode="keyword")
    assert before.results == [] and audit.flush(60)
    remember({"id": "a", "namespace": "n", "content": "the deploy window is friday"})
    after = search("deploy window", mode="keyword")
    assert [r.id for r in after.results] == ["a"] and audit.flush(60)
    assert {r.query_id for r in pa.tail(pa.log_of(embedded), 10)} == {before.query_id, after.query_id}


def test_on_workers_an_audit_write_takes_its_host_waiting_rows_in_one_transaction(embedded, monkeypatch):
    """Issue 33: the audit worker's cost is per batch, not per query. An
    ``audit.write`` writes, with its own rows, those of the other outbox files
    waiting on its host, in one transaction (one lake commit); their messages
    then write nothing. A message from another host's outbox is written as it comes."""
    from pipeline.audit.letters import outbox_id, outbox_pending, outbox_put
    from workers import tasks
    from workers.app import get_app

    embedded.audit_outbox_after_s = 3600.0  # the outbox drain thread stays out of it
    folder = embedded.audit_outbox_dir
    rows = [_row(i).model_dump(mode="json") for i in range(30)]
    names = [outbox_put(folder, [row]) for row in rows]  # as 30 search.budget tasks of this host left them
    host = outbox_id(folder)
    calls: list[int] = []
    real = tasks.write_records
    monkeypatch.setattr(tasks, "write_records", lambda log, records: calls.append(len(records)) or real(log, records))
    task = get_app().tasks["audit.write"]
    first = task.apply(args=[rows[:1]], kwargs={"outbox": names[0], "host": host}).get()
    assert first["inserted"] == 30 and first["with_others"] == 29 and calls == [30]
    assert outbox_pending(folder) == []
    for row, name in zip(rows[1:], names[1:]):
        assert task.apply(args=[[row]], kwargs={"outbox": name, "host": host}).get()["batched"]
    assert calls == [30]  # the 29 other messages: no transaction
    elsewhere = _row(99).model_dump(mode="json")
    out = task.apply(args=[[elsewhere]], kwargs={"outbox": names[0], "host": "another-host"}).get()
    assert out["inserted"] == 1 and calls == [30, 1]
    assert pa.count(pa.log_of(embedded)) == (31, 31)
    assert _audit_commits(embedded) == 2


def test_on_workers_a_search_process_sends_its_rows_of_a_linger_as_one_message(embedded, monkeypatch):
    """Issue 33: a search process keeps each batch's rows in the outbox as it
    answers (``workers.audit.send``) and sends them, a linger after the
    first, as one ``audit.write`` naming every file; that message writes them
    in one transaction and removes the files, and sent again it writes nothing."""
    import time

    from pipeline.audit.letters import outbox_id, outbox_pending
    from workers import audit
    from workers.app import get_app

    embedded.audit_outbox_after_s = 3600.0  # the outbox drain thread stays out of it
    sent: list[tuple[list, dict]] = []

    class Broker:  # the process's app as a search worker has it: sending, not running, its messages
        conf = type("conf", (), {"task_always_eager": False})()

        @staticmethod
        def send_task(name, args, kwargs):
            assert name == "audit.write"
            sent.append((json.loads(json.dumps(args[0])), kwargs))  # as JSON on the wire

    monkeypatch.setattr(audit, "SEND_LINGER_S", 0.5)
    rows = [_row(i) for i in range(12)]
    t0 = time.monotonic()
    for i in range(0, 12, 3):  # four answered batches of three queries
        audit.send(Broker, rows[i:i + 3])
    folder = embedded.audit_outbox_dir
    assert len(outbox_pending(folder)) == 4 and sent == []  # kept, not sent yet
    while not sent and time.monotonic() - t0 < 10:
        time.sleep(0.02)
    assert time.monotonic() - t0 >= 0.5
    ((payload, kept),) = sent
    assert [r["query_id"] for r in payload] == [r.query_id for r in rows]
    assert sorted(kept["outbox"]) == sorted(p.name for p in outbox_pending(folder)) and kept["host"] == outbox_id(folder)

    task = get_app().tasks["audit.write"]
    out = task.apply(args=[payload], kwargs=kept).get()
    assert out["inserted"] == 12 and "with_others" not in out
    assert outbox_pending(folder) == [] and _audit_commits(embedded) == 1
    assert task.apply(args=[payload], kwargs=kept).get()["batched"]  # redelivered: its files are gone
    assert pa.count(pa.log_of(embedded)) == (12, 12) and _audit_commits(embedded) == 1


def test_a_message_naming_some_files_still_there_writes_its_rows_once_and_skips_those_files(embedded):
    """A message whose files were partly written by another batch writes its
    rows (the ones already in are found and left), takes none of its own files
    as the host's others, and removes them all."""
    from pipeline.audit.letters import outbox_id, outbox_pending, outbox_put
    from workers.app import get_app

    embedded.audit_outbox_after_s = 3600.0
    folder = embedded.audit_outbox_dir
    rows = [_row(i).model_dump(mode="json") for i in range(6)]
    names = [outbox_put(folder, [row]) for row in rows]
    other = outbox_put(folder, [_row(50).model_dump(mode="json")])  # a later query's, not in the message
    host = outbox_id(folder)
    task = get_app().tasks["audit.write"]
    assert task.apply(args=[rows[:2]], kwargs={"outbox": names[:2], "host": host}).get()["inserted"] == 2 + 4 + 1
    assert outbox_pending(folder) == []  # the message's two, and the host's five others, written at once
    assert pa.count(pa.log_of(embedded)) == (7, 7)
    again = [outbox_put(folder, [rows[0]])]  # sent again as a new file, with one already gone
    out = task.apply(args=[rows[:2]], kwargs={"outbox": again + names[1:2], "host": host}).get()
    assert out["inserted"] == 0 and outbox_pending(folder) == [] and other not in again
    assert pa.count(pa.log_of(embedded)) == (7, 7)


def test_a_purge_is_not_undone_by_a_message_still_on_its_way(embedded, monkeypatch):
    """``dimple audit purge`` takes rows from the outbox files a search
    process's ``audit.write`` still names (one file keeps a row to purge
    among others, another only such rows, and is removed): the message,
    written after, writes its files' rows as they are now, and the rows no
    file kept (an outbox it could not write to) from itself."""
    import time

    from pipeline.audit import letters
    from pipeline.audit.purge import purge
    from workers import audit
    from workers.app import get_app

    embedded.audit_outbox_after_s = 3600.0  # the outbox drain thread stays out of it
    sent: list[tuple[list, dict]] = []

    class Broker:
        conf = type("conf", (), {"task_always_eager": False})()

        @staticmethod
        def send_task(name, args, kwargs):
            sent.append((json.loads(json.dumps(args[0])), kwargs))

    monkeypatch.setattr(audit, "SEND_LINGER_S", 0.3)
    secret = "ZQX vault plan"
    rows = [_row(i, secret if i in (1, 3, 4) else "a question") for i in range(7)]
    real_put, calls = letters.outbox_put, []

    def put(folder, payload):  # the first batch's outbox file cannot be written: the message alone keeps it
        calls.append(1)
        if len(calls) == 1:
            raise OSError("read-only audit dir")
        return real_put(folder, payload)

    monkeypatch.setattr(audit, "outbox_put", put)
    for part in (rows[5:7], rows[0:3], rows[3:5]):
        audit.send(Broker, part)
    t0 = time.monotonic()
    while not sent and time.monotonic() - t0 < 10:
        time.sleep(0.02)
    ((payload, kept),) = sent
    assert kept["unkept"] == 2 and len(kept["outbox"]) == 2
    log = pa.log_of(embedded)
    report = purge(log, embedded.audit_outbox_dir, embedded.dead_letter_dir, [], [secret])
    assert report.outbox_rows == 3 and report.rows == 0
    out = get_app().tasks["audit.write"].apply(args=[payload], kwargs=kept).get()
    assert out["inserted"] == 4
    assert sorted(r.query_id for r in pa.tail(log, 10)) == sorted(rows[i].query_id for i in (0, 2, 5, 6))
    assert letters.outbox_pending(embedded.audit_outbox_dir) == []
    # every file it names gone (written, or purged whole): the rows no file kept still go in
    later = [_row(i).model_dump(mode="json") for i in (7, 8)]
    again = get_app().tasks["audit.write"].apply(args=[later + payload[2:]], kwargs={**kept, "unkept": 2}).get()
    assert again["inserted"] == 2 and pa.count(log) == (6, 6)


def test_a_purge_while_the_message_waits_its_turn_to_write_is_not_undone(embedded, monkeypatch):
    """An ``audit.write`` reads its outbox files, then waits its turn (at most
    one transaction a second, ``PACE``) before writing: a purge in that wait
    takes the rows from the files, and the message writes the files as they
    are after it, not the rows it read before."""
    from pipeline.audit import letters
    from pipeline.audit.purge import purge
    from workers import audit
    from workers.app import get_app

    embedded.audit_outbox_after_s = 3600.0  # the outbox drain thread stays out of it
    secret = "ZQX vault plan"
    rows = [_row(i, secret if i == 1 else "a question") for i in range(3)]
    name = letters.outbox_put(embedded.audit_outbox_dir, [r.model_dump(mode="json") for r in rows])
    log = pa.log_of(embedded)
    purged = []

    def wait_and_a_purge_meanwhile():
        purged.append(purge(log, embedded.audit_outbox_dir, embedded.dead_letter_dir, [], [secret]))

    monkeypatch.setattr(audit.PACE, "wait", wait_and_a_purge_meanwhile)
    payload = [r.model_dump(mode="json") for r in rows]
    out = get_app().tasks["audit.write"].apply(args=[payload], kwargs={"outbox": [name], "unkept": 0,
                                                                       "host": audit.outbox_id(embedded.audit_outbox_dir)}).get()
    assert purged[0].outbox_rows == 1
    assert out["inserted"] == 2
    assert sorted(r.query_id for r in pa.tail(log, 10)) == sorted(rows[i].query_id for i in (0, 2))


def test_rows_a_search_process_cannot_send_stay_in_the_outbox_and_it_says_so(embedded, caplog):
    """The broker down when a search process sends: its rows stay in the
    outbox for the host's drain (a WARNING names how many files), and rows
    kept in no outbox are reported lost at ERROR."""
    import logging

    from pipeline.audit.letters import outbox_pending
    from workers import audit

    class Down:
        conf = type("conf", (), {"task_always_eager": False})()

        @staticmethod
        def send_task(name, args, kwargs):
            raise ConnectionError("redis is down")

    caplog.set_level(logging.WARNING, logger="dimple.audit")
    audit.send(Down, [_row(1), _row(2)])
    audit._SENDER.add(Down, embedded, None, [_row(3).model_dump(mode="json")])  # its outbox could not be written
    audit.send_pending()
    assert len(outbox_pending(embedded.audit_outbox_dir)) == 1
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert ("WARNING", "audit.write could not be sent (ConnectionError: redis is down); the audit worker writes "
                       "the rows of 1 outbox file(s) from there") in said
    assert ("ERROR", "audit.write could not be sent (ConnectionError: redis is down); 1 row(s) kept in no "
                     "outbox are lost") in said
