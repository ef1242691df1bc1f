"""Forget must erase (issue 30): a forgotten memory is gone from results and
links at once, and after one ``dimple compact`` (plus ``dimple audit purge``
for the audit trail) no file under the data dir holds its text or its id.
On the segment store (``on_segments``); the lake's erase is tested in
``test_store_engines`` and ``tests/unit/test_lake*``."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline import audit as pa
from pipeline.errors import InputError
from pipeline.store import segments
from pipeline.store.compact import compact
from pipeline.store.lake.follow import reader_for
from pipeline.store.reader import Reader
from pipeline.store.stats import store_stats
from pipeline.store.writes import get, parse_records, write
from tests.conftest import on_segments, write_jsonl
from tests.embedded.test_cli import cli_env  # noqa: F401 (a fixture)
from tests.unit.test_segments import compact_killed_after_publishing
from workers.cli import main

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


def _stats_edges(capsys) -> dict:
    capsys.readouterr()
    assert main(["stats", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["edges"]


def _topic_keys(settings) -> list[str]:
    reader = Reader(settings.data_dir)
    try:
        return [r[0] for r in reader.snapshot().store.con.execute("SELECT topic_key FROM topics").fetchall()]
    finally:
        reader.close()


@on_segments
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
    # the text in a delta too (rewritten), and a link to it from a delta memory
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

    capsys.readouterr()
    assert main(["compact"]) == 0
    out = capsys.readouterr().out
    assert "3 delta(s)" in out and "1 forgotten memory erased" in out, out
    assert worker_audit.flush()
    assert main(["audit", "purge", SECRET_ID, "--text", TOKEN]) == 0
    assert "purged 3 audit row(s)" in capsys.readouterr().out  # the two that served it, the one that quoted it

    assert traces(cli_env.data_dir, TOKEN, SECRET_ID) == []
    assert not list((cli_env.data_dir / segments.SEGMENTS).glob("delta-*"))
    # the store and the log still work, and the log kept the rows that never saw it
    assert {m["id"] for m in api.get(["successor", "backed"])} == {"successor", "backed"}
    assert api.search("opens", mode="hybrid").results
    assert worker_audit.flush()
    assert [r.query_text for r in pa.tail(pa.log_of(cli_env), 10)] == ["backup restore", "opens"]
    capsys.readouterr()
    assert main(["compact"]) == 0  # a second one, with nothing to do
    assert capsys.readouterr().out.startswith("nothing to compact")


def _settings_store(settings):
    recs = [{"id": SECRET_ID, "namespace": "ops", "content": f"the vault code is {TOKEN}"},
            {"id": "keep", "namespace": "ops", "content": "backups run nightly"}, *_others(20, "ops")]
    write(settings, parse_records(recs, settings))  # the base
    write(settings, parse_records([{"id": "later", "namespace": "ops", "content": f"{TOKEN} again",
                                    "supersedes": [SECRET_ID]}], settings))


@on_segments
def test_a_second_compaction_finishes_an_erase_the_first_was_killed_in(settings, monkeypatch):
    _settings_store(settings)
    write(settings, forget=[SECRET_ID, "later"])
    compact_killed_after_publishing(settings, monkeypatch)
    assert traces(settings.data_dir, TOKEN)  # the merged deltas are still there
    report = compact(settings, wait=True)
    assert not report.ran and len([f for f in report.removed if "delta-" in f]) == 4  # 2 deltas, .json and .npy
    assert traces(settings.data_dir, TOKEN, SECRET_ID) == []
    assert [m["id"] for m in get(settings, ["keep", "later", SECRET_ID])] == ["keep"]


@on_segments
def test_a_reader_that_had_not_read_the_erased_deltas_loads_the_new_base(settings):
    _settings_store(settings)
    reader = Reader(settings.data_dir)
    before = reader.snapshot()
    assert "later" in before.overlay.members
    write(settings, forget=[SECRET_ID])  # a delta this reader never reads: compaction removes it
    report = compact(settings, wait=True)
    assert report.forgotten == 1 and segments.read_manifest(settings.data_dir).erased
    after = reader.snapshot()
    assert after.base == segments.read_manifest(settings.data_dir).base
    assert SECRET_ID not in after.overlay.members
    assert after.store.existing_ids([SECRET_ID, "later", "keep"]) == {"later", "keep"}
    # its link went with it, from the base too
    assert after.store.con.execute("SELECT count(*) FROM edges").fetchone()[0] == 0
    assert get(settings, ["later"], reader=reader)[0]["supersedes"] == []
    reader.close()


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


def test_audit_purge_clears_log_outbox_and_dead_letters_and_the_log_stays_whole(tmp_path):
    from pipeline.audit.letters import dead_letter, outbox_put

    log, outbox, letters = tmp_path / "audit.duckdb", tmp_path / "audit-outbox", tmp_path / "audit-dead-letters"
    kept, served, quoted = _row("q-kept", "backups", ["keep"]), _row("q-served", "vault", [SECRET_ID, "keep"]), \
        _row("q-quoted", f"what is {TOKEN.lower()}", [])
    assert pa.write_records(log, [kept, served, quoted]) == 3
    box = outbox / outbox_put(outbox, [served.model_dump(mode="json"), kept.model_dump(mode="json")])
    dead_letter(letters, quoted, "gave up")
    dead_letter(letters, _row("q-other", "cache", []), "gave up")

    with pytest.raises(InputError, match="ids"):
        pa.purge(log, outbox, letters, [])
    done = pa.purge(log, outbox, letters, [SECRET_ID], [TOKEN])
    assert (done.rows, done.outbox_rows, done.dead_letters) == (2, 1, 1)
    assert traces(tmp_path, TOKEN, SECRET_ID) == []
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["audit.duckdb"]  # no copy left beside it
    assert [r["query_id"] for r in json.loads(box.read_text())["records"]] == ["q-kept"]
    assert [p.name for p in letters.glob("*.json")] == ["q-other.json"]
    assert [r.query_id for r in pa.tail(log, 10)] == ["q-kept"]
    assert pa.write_records(log, [kept, _row("q-new", "later", [])]) == 1  # the key still holds
    assert pa.purge(log, outbox, letters, [SECRET_ID]).rows == 0


def test_audit_purge_takes_an_id_whole_and_never_matches_query_ids(tmp_path):
    """``purge m1`` removes the rows that served m1, not those that served m10,
    and a short id never matches the uuid of a row's own query id."""
    log, outbox, letters = tmp_path / "audit.duckdb", tmp_path / "audit-outbox", tmp_path / "audit-dead-letters"
    rows = [_row("7f00aa7b", "about m1", ["m1"]), _row("77777777", "another", ["m10", "m2"]),
            _row("a7a7a7a7", "deploy", ["m3"])]
    assert pa.write_records(log, rows) == 3
    assert pa.purge(log, outbox, letters, ["m1"]).rows == 1
    assert [r.query_id for r in pa.tail(log, 10)] == ["a7a7a7a7", "77777777"]
    assert pa.purge(log, outbox, letters, ["7"]).rows == 0  # in every query id, in no field
    assert pa.purge(log, outbox, letters, [], ["DEPLOY"]).rows == 1  # a text, ignoring case
    assert [r.query_id for r in pa.tail(log, 10)] == ["77777777"]


@on_segments
def test_a_delta_written_while_an_erase_ran_goes_with_the_same_compaction(settings, monkeypatch):
    """A write during the compaction that erases is routed to the old base's
    topic keys, which may hold the forgotten word: that compaction merges it
    too before it returns (a second pass), so no file keeps the word."""
    from pipeline.store import compact as compaction

    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   {"id": "door", "namespace": "vault", "content": "it opens"}], settings))
    write(settings, forget=[SECRET_ID])
    relabel = compaction.relabel_topics
    wrote = []

    def meanwhile(*args, **kwargs):
        if not wrote:  # the erasing pass only
            wrote.append(write(settings, parse_records([{"id": "during", "namespace": "vault",
                                                         "content": "it opens too"}], settings)))
        relabel(*args, **kwargs)

    monkeypatch.setattr(compaction, "relabel_topics", meanwhile)
    done = compact(settings, wait=True)
    monkeypatch.undo()
    assert wrote and wrote[0].delta is not None  # written as a delta while the erase ran
    assert done.merged_deltas == 2  # the forget's delta, then (second pass) the one written meanwhile
    assert traces(settings.data_dir, TOKEN, SECRET_ID) == []
    manifest = segments.read_manifest(settings.data_dir)
    assert manifest.deltas == [] and manifest.erase_pending == []
    assert [m["id"] for m in get(settings, ["door", "during", SECRET_ID])] == ["door", "during"]


@on_segments
def test_only_an_erasing_compaction_deletes_its_merged_deltas_at_once(settings):
    """``erased`` describes the last compaction: after an erase, a compaction
    with nothing forgotten keeps its merged deltas for readers still on the old
    base, as every compaction did before."""
    write(settings, parse_records([{"id": SECRET_ID, "namespace": "vault", "content": f"{TOKEN} opens it"},
                                   {"id": "door", "namespace": "vault", "content": "it opens"}], settings))
    write(settings, forget=[SECRET_ID])
    compact(settings, wait=True)
    assert segments.read_manifest(settings.data_dir).erased
    later = write(settings, parse_records([{"id": "later", "namespace": "vault", "content": "it shuts"}], settings))
    compact(settings, wait=True)
    manifest = segments.read_manifest(settings.data_dir)
    assert not manifest.erased and [d.seq for d in manifest.consumed] == [later.delta]
    assert (settings.data_dir / manifest.consumed[0].file).is_file()  # kept until the next compaction
