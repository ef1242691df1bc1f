"""The audit outbox (pipeline/audit/letters.py): rows kept on disk until they
are in the log, written once however often they are drained, a bad file set
apart with its field named, and a message can only remove an outbox file."""

from __future__ import annotations

import json
import os
import time

import pytest

from pipeline.audit.lake import LakeLog, log_of
from pipeline.audit.letters import drain_outbox, outbox_done, outbox_pending, outbox_put
from pipeline.audit.reader import count
from pipeline.audit.record import AuditRecord
from pipeline.audit.writer import write_records
from pipeline.errors import AuditStoreUnavailable
from pipeline.settings import Settings


def _log(tmp_path) -> LakeLog:
    return log_of(Settings(data_dir=tmp_path / "data", _env_file=None))


def _dead_letters(tmp_path, n: int):
    """A dead-letter folder holding rows ``dead0`` .. ``dead{n-1}``."""
    from pipeline.audit.letters import dead_letter

    folder = tmp_path / "dead"
    for i in range(n):
        dead_letter(folder, AuditRecord.model_validate(_row(f"dead{i}")), "store was down")
    return folder


def _row(qid: str) -> dict:
    return {
        "query_id": qid, "logged_at": "2026-11-30T12:00:00", "query_hash": "00", "hash_of": "text", "mode": "keyword",
        "requested_mode": "keyword", "query_text": "q", "options": {}, "query_profile": {}, "sources": [],
        "result_count": 0, "truncated": False, "truncation": None, "latency_ms": {}, "total_ms": 1.0, "rrf_k": 60,
    }


def test_drained_rows_are_written_once_and_their_files_removed(tmp_path):
    box, log = tmp_path / "outbox", _log(tmp_path)
    outbox_put(box, [_row("q1"), _row("q2")])
    outbox_put(box, [_row("q2"), _row("q3")])  # a row sent twice (a redelivered stage)
    writes = []
    files, inserted = drain_outbox(box, tmp_path / "dead", lambda rows: writes.append(len(rows)) or
                                   write_records(log, rows))
    assert (files, inserted) == (2, 3)
    assert count(log) == (3, 3)
    assert outbox_pending(box) == []
    outbox_put(box, [_row("q1")])  # drained again: nothing added
    assert drain_outbox(box, tmp_path / "dead", lambda rows: write_records(log, rows)) == (1, 0)
    assert count(log) == (3, 3)


def test_only_files_older_than_the_grace_are_drained(tmp_path):
    box = tmp_path / "outbox"
    old = box / outbox_put(box, [_row("old")])
    outbox_put(box, [_row("new")])
    past = time.time() - 60
    os.utime(old, (past, past))
    assert outbox_pending(box, older_than_s=30) == [old]


def test_a_failed_write_keeps_the_files(tmp_path):
    box = tmp_path / "outbox"
    outbox_put(box, [_row("q1")])

    def broken(rows):
        raise AuditStoreUnavailable("disk full")

    with pytest.raises(AuditStoreUnavailable):
        drain_outbox(box, tmp_path / "dead", broken)
    assert len(outbox_pending(box)) == 1


def test_a_file_that_is_not_rows_is_set_apart_with_the_field_named(tmp_path):
    box, log = tmp_path / "outbox", _log(tmp_path)
    bad = box / outbox_put(box, [_row("ok")])
    bad.write_text(json.dumps({"records": [{**_row("x"), "result_count": "many"}]}))
    outbox_put(box, [_row("q1")])
    assert drain_outbox(box, tmp_path / "dead", lambda rows: write_records(log, rows)) == (1, 1)
    kept = list((tmp_path / "dead" / "invalid").glob("*.json"))
    assert len(kept) == 1 and "result_count" in json.loads(kept[0].read_text())["error"]
    assert outbox_pending(box) == []


@pytest.mark.parametrize("name", ["../audit.duckdb", "/etc/passwd", "x.json", 5, None, "0" * 20 + "-" + "a" * 31 + ".json"])
def test_a_message_can_only_remove_an_outbox_file(tmp_path, name):
    victim = tmp_path / "audit.duckdb"
    victim.write_text("keep me")
    box = tmp_path / "outbox"
    kept = box / outbox_put(box, [_row("q1")])
    outbox_done(box, name)
    assert victim.exists() and kept.exists()
    outbox_done(box, kept.name)
    assert not kept.exists()


def test_a_retry_whose_letters_another_retry_took_meanwhile_finishes_the_rest(tmp_path, monkeypatch):
    """Two ``dimple audit retry`` at once (or a purge beside one): a letter the
    other removed between this one's write and its clean-up is not an error,
    and the batches after it are still written."""
    from pipeline.audit import letters
    from pipeline.audit.letters import retry_dead_letters

    log, folder = _log(tmp_path), _dead_letters(tmp_path, 4)
    real = letters.write_records

    def and_the_other_retry_takes_them(log_, records):
        inserted = real(log_, records)
        for record in records:  # the other process wrote them too, and removed their letters
            (folder / f"{record.query_id}.json").unlink()
        return inserted

    monkeypatch.setattr(letters, "write_records", and_the_other_retry_takes_them)
    written, present, errors = retry_dead_letters(folder, log, batch=2)
    assert (written, present, errors) == (4, 0, [])
    assert count(log)[0] == 4


def test_the_embedded_writer_stops_retrying_once_the_store_is_down_and_starts_again_once_it_is_back(tmp_path,
                                                                                                   monkeypatch):
    """At the defaults a batch retries for minutes before its rows go to the
    dead letters; the batches behind it, queries adding more all the while,
    are tried once each while the store stays down (they reach the dead
    letters as fast as they come, the queue does not grow without bound),
    and the first that goes in brings the retries back."""
    from workers import audit
    from workers.settings import WorkerSettings

    settings = WorkerSettings(data_dir=tmp_path / "data", embedding_model="hash-64", _env_file=None)
    assert settings.audit_max_retries == 8  # the default
    slept: list[float] = []
    monkeypatch.setattr(audit.time, "sleep", slept.append)
    down = [True]
    tries: list[int] = []

    def store(log, records):
        tries.append(len(records))
        if down[0]:
            raise AuditStoreUnavailable("disk full")
        return len(records)

    monkeypatch.setattr(audit, "write_records", store)
    batch = [AuditRecord.model_validate(_row(f"q{i}")) for i in range(3)]
    assert audit.write_embedded(settings, batch) == 0
    assert len(tries) == 9 and len(slept) == 8 and sum(slept) > 60  # the whole backoff, then dead letters
    tries.clear(), slept.clear()
    for _ in range(5):
        assert audit.write_embedded(settings, batch) == 0
    assert len(tries) == 5 and slept == []  # once each, straight to the dead letters
    assert len(list((settings.dead_letter_dir).glob("*.json"))) == 3
    down[0] = False
    assert audit.write_embedded(settings, batch) == 3
    down[0] = True
    tries.clear()
    assert audit.write_embedded(settings, batch) == 0
    assert len(tries) == 9  # back up, then down again: retried in full


def test_a_purge_finds_a_non_ascii_id_in_a_file_set_apart(tmp_path):
    """An outbox file set apart (not rows) keeps what it held as JSON, not as
    the file's text, whose escapes hid a non-ASCII id or word from a purge."""
    from pipeline.audit.purge import purge

    box, log, dead = tmp_path / "outbox", _log(tmp_path), tmp_path / "dead"
    bad = box / outbox_put(box, [_row("ok")])
    bad.write_text(json.dumps({"records": [{**_row("x"), "result_count": "many", "query_text": "le mémo café",
                                            "sources": [{"id": "mémo-1"}]}]}))  # ensure_ascii: \u00e9
    drain_outbox(box, dead, lambda rows: write_records(log, rows))
    assert len(list((dead / "invalid").glob("*.json"))) == 1
    assert purge(log, box, dead, ["mémo-1"]).dead_letters == 1
    assert list((dead / "invalid").glob("*.json")) == []


def test_a_retry_does_not_write_back_a_letter_a_purge_removed_after_it_was_read(tmp_path, monkeypatch):
    from pipeline.audit import letters, tail
    from pipeline.audit.letters import retry_dead_letters

    log, folder = _log(tmp_path), _dead_letters(tmp_path, 3)
    real = letters._readable_letters

    def read_then_a_purge(folder_, errors):
        found = real(folder_, errors)
        (folder / "dead1.json").unlink()  # `dimple audit purge` took it meanwhile
        return found

    monkeypatch.setattr(letters, "_readable_letters", read_then_a_purge)
    assert retry_dead_letters(folder, log) == (2, 0, [])
    assert sorted(r.query_id for r in tail(log, 10)) == ["dead0", "dead2"]
