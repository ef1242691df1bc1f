"""Audit trail in embedded mode: one row per query, identity hashes, the log
line, idempotent writes, failures typed and dead-lettered, retry after repair."""

from __future__ import annotations

import json
import logging
from datetime import datetime

import numpy as np
import pytest

from pipeline import audit as pa
from pipeline.embedders import HashEmbedder
from pipeline.identity import fnv1a64, text_identity, vector_identity
from tests.conftest import use_store, write_jsonl
from workers.cli import main
from workers.cli.common import ingest_file


# FNV-1a 64 test vectors from the FNV reference (draft-eastlake-fnv, test suite).
@pytest.mark.parametrize(
    "data,expected",
    [(b"", 0xCBF29CE484222325), (b"a", 0xAF63DC4C8601EC8C), (b"foobar", 0x85944171F73967E8)],
)
def test_fnv1a64_reference_vectors(data, expected):
    assert fnv1a64(data) == expected


def _store(settings, tmp_path, n=40):
    recs = [{"id": f"m{i}", "namespace": "ns", "content": f"note {i} on deploy window db-{i}"} for i in range(n)]
    ingest_file(write_jsonl(tmp_path / "m.jsonl", recs), settings, progress=False)


def test_exactly_one_row_per_query(embedded, tmp_path):
    from workers import audit
    from workers.api import search_many

    _store(embedded, tmp_path)
    asks = [{"query": f"deploy window {i}", "mode": ("keyword", "semantic", "hybrid")[i % 3]} for i in range(1000)]
    results = search_many(asks, batch_size=100)
    assert audit.flush(60)
    rows, distinct = pa.count(pa.log_of(embedded))
    assert (rows, distinct) == (1000, 1000)
    logged = {r.query_id for r in pa.tail(pa.log_of(embedded), 2000)}
    assert logged == {r.query_id for r in results}


def _rows_unwritten(embedded, tmp_path, monkeypatch, n: int) -> list:
    """The audit rows of ``n`` keyword queries on a fresh store, kept, none written."""
    from workers import audit
    from workers.api import search

    _store(embedded, tmp_path)
    made: list = []
    monkeypatch.setattr(audit, "send", lambda app, records: made.extend(records))
    for i in range(n):
        search(f"deploy window {i}", mode="keyword")
    monkeypatch.undo()
    return made


def test_rows_queued_for_two_stores_each_go_to_their_own(embedded, tmp_path, monkeypatch):
    """The embedded writer writes the rows waiting behind each other together
    (one transaction per run of rows, not per row): rows queued for one store
    and another, interleaved, still land each in its own store, once."""
    from workers import audit

    made = _rows_unwritten(embedded, tmp_path, monkeypatch, 30)
    other = embedded.replace(data_dir=tmp_path / "other")
    asked: dict = {pa.log_of(embedded): set(), pa.log_of(other): set()}
    for i, record in enumerate(made):
        settings = (embedded, other)[(i // 4) % 2]  # runs of four for each store
        audit._EMBEDDED.put(settings, [record])
        asked[pa.log_of(settings)].add(record.query_id)
    audit._EMBEDDED.put(embedded, made[:3])  # delivered twice: written once
    assert audit.flush(60)
    for path, ids in asked.items():
        assert pa.count(path) == (len(ids), len(ids))
        assert {r.query_id for r in pa.tail(path, 100)} == ids
    assert len(asked[pa.log_of(embedded)]) + len(asked[pa.log_of(other)]) == 30


def test_rows_the_writer_holds_when_the_process_exits_are_kept_as_dead_letters(embedded, tmp_path, monkeypatch):
    """The writer takes the queued rows before writing them; at exit, stuck on
    them (the audit store failing, its retries pausing), they are no longer in
    the queue. Was: lost without a word; now dead letters, as the rows queued
    behind them are."""
    import threading

    from workers import audit

    made = _rows_unwritten(embedded, tmp_path, monkeypatch, 4)
    stuck, release = threading.Event(), threading.Event()
    real = audit.write_embedded

    def write_stuck(settings, records):
        stuck.set()
        release.wait(30)
        return real(settings, records)

    monkeypatch.setattr(audit, "write_embedded", write_stuck)
    monkeypatch.setattr(audit, "EXIT_FLUSH_S", 0.3)
    try:
        audit._EMBEDDED.put(embedded, made[:2])
        assert stuck.wait(10)  # the writer holds the first two
        audit._EMBEDDED.put(embedded, made[2:])  # queued behind them
        audit._drain_at_exit()
        kept = {r.query_id for _, _, r in pa.dead_letters(embedded.dead_letter_dir)}
        assert kept == {r.query_id for r in made}
    finally:
        release.set()
        monkeypatch.undo()
        assert audit.flush(60)


def test_row_reconstructs_the_results(embedded, tmp_path):
    from workers import audit
    from workers.api import search

    _store(embedded, tmp_path)
    res = search("deploy window db-7", max_units=3, recency_boost=0.5, fusion="rrf")
    audit.flush()
    row = pa.get(pa.log_of(embedded), res.query_id)
    assert row.query_text == "deploy window db-7"
    assert row.query_hash == text_identity("deploy window db-7") and row.hash_of == "text"
    assert [s["id"] for s in row.sources] == [r.id for r in res.results]
    assert row.truncated and row.truncation["by"] == "maxUnits"
    assert set(row.query_profile["legs"]) == {"vector", "fts"}
    for path, r in zip(pa.explain(row), res.results):
        # RRF contributions from the row alone add up to the served RRF score
        assert sum(path["rrf_contributions"].values()) == pytest.approx(r.rrf)
        assert r.score == pytest.approx(r.rrf * (1 + 0.5 * path["recency_factor"]))


def test_semantic_identity_is_the_full_vector(embedded, tmp_path):
    from workers import audit
    from workers.api import search

    _store(embedded, tmp_path)
    res = search("deploy window", mode="semantic")
    audit.flush()
    row = pa.get(pa.log_of(embedded), res.query_id)
    vec = HashEmbedder(64).embed(["deploy window"])[0]
    assert row.hash_of == "vector" and row.query_hash == vector_identity(vec)
    changed = vec.copy()
    changed[-1] = np.nextafter(changed[-1], np.float32(2))  # last component only
    assert vector_identity(changed) != row.query_hash


def test_query_text_can_be_left_out(embedded, tmp_path):
    from workers import audit, resources
    from workers.api import search

    _store(embedded, tmp_path)
    resources.current().configure(embedded.replace(store_query_text=False))
    res = search("secret plans")
    audit.flush()
    assert pa.get(pa.log_of(embedded), res.query_id).query_text is None


def test_every_query_logs_one_line_empty_store_included(embedded, caplog):
    from workers.api import search_many

    caplog.set_level(logging.INFO, logger="dimple.search")
    results = search_many(["first", "second"])  # no store exists yet
    lines = [r.getMessage() for r in caplog.records if r.name == "dimple.search"]
    assert len(lines) == 2
    for line, res in zip(lines, results):
        assert line.startswith("hybrid.search ") and f"query_id={res.query_id}" in line
        assert "results=0" in line and "truncated=false" in line


def test_write_is_idempotent_by_query_id(embedded, tmp_path):
    from workers import audit
    from workers.api import search

    _store(embedded, tmp_path)
    res = search("deploy")
    audit.flush()
    row = pa.get(pa.log_of(embedded), res.query_id)
    assert pa.write_record(pa.log_of(embedded), row) is False
    assert pa.count(pa.log_of(embedded)) == (1, 1)


def test_unwritable_audit_store_fails_typed_then_retry_writes_once(embedded, tmp_path, caplog, capsys, monkeypatch):
    from pipeline.audit import lake as audit_lake
    from pipeline.errors import StoreError
    from pipeline.store.lake.catalog import attach
    from workers import audit, resources
    from workers.api import search_many

    _store(embedded, tmp_path)
    resources.current().configure(embedded.replace(audit_max_retries=2, audit_backoff_base_s=0.01))
    audit_lake.release(pa.log_of(embedded))

    def unreachable(settings, **kwargs):  # the audit's catalog cannot be opened; the store's reader is not touched
        raise StoreError(f"store.catalog: cannot open the lake catalog {settings.lake_catalog}: unable to open")

    monkeypatch.setattr(audit_lake, "attach", unreachable)
    caplog.set_level(logging.ERROR, logger="dimple.audit")
    results = search_many([f"deploy {i}" for i in range(20)])
    assert all(r.results for r in results)  # queries answer regardless
    assert audit.flush(60)
    letters = pa.dead_letters(embedded.dead_letter_dir)
    assert {row.query_id for _, _, row in letters} == {r.query_id for r in results}
    assert all(f"cannot open {pa.log_of(embedded)}" in err for _, err, _ in letters)
    gave_up = [r.getMessage() for r in caplog.records if "audit.write gave up on" in r.getMessage()]
    assert sum(int(m.split("gave up on ")[1].split(" row(s)")[0]) for m in gave_up) == 20  # a line a batch

    use_store(monkeypatch, embedded)
    from workers.settings import get_settings

    get_settings.cache_clear()
    try:
        assert main(["audit", "failed"]) == 0
        assert "20 audit row(s) waiting" in capsys.readouterr().out
        assert main(["audit", "retry"]) == 1  # still broken: reported, nothing lost
        assert len(pa.dead_letters(embedded.dead_letter_dir)) == 20
        monkeypatch.setattr(audit_lake, "attach", attach)  # repair
        assert main(["audit", "retry"]) == 0
        assert "written 20" in capsys.readouterr().out
        assert pa.count(pa.log_of(embedded)) == (20, 20)
        assert main(["audit", "retry"]) == 0 and pa.dead_letters(embedded.dead_letter_dir) == []
        assert "written 0" in capsys.readouterr().out
        assert pa.count(pa.log_of(embedded)) == (20, 20)
        assert main(["audit", "tail", "-n", "3", "--json"]) == 0
        tail = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
        assert len(tail) == 3
        assert main(["audit", "tail", "-n", "0"]) == 2 and "-n: must be at least 1" in capsys.readouterr().err
        assert main(["audit", "explain", results[0].query_id]) == 0
        out = capsys.readouterr().out
        assert "replay now: same list" in out and "convex" in out  # the default fusion's score (issue 31)
        assert main(["audit", "show", "no-such-id"]) == 2
    finally:
        get_settings.cache_clear()


def test_failed_write_is_a_typed_task_failure(embedded, tmp_path):
    from pipeline.errors import AuditRetriesExhausted
    from workers import resources
    from workers.api import search
    from workers.app import get_app

    _store(embedded, tmp_path)
    res = search("deploy")
    from workers import audit

    audit.flush()
    row = pa.get(pa.log_of(embedded), res.query_id).model_dump(mode="json")
    row["query_id"] = "other-id"
    row = [row]
    resources.current().configure(embedded.replace(audit_max_retries=1, audit_backoff_base_s=0.01, data_dir=tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "lake.sqlite").mkdir()  # a folder where the lake's catalog should be: it cannot open
    result = get_app().tasks["audit.write"].apply(args=[row], retries=1, throw=False)  # the last allowed attempt
    assert result.state == "FAILURE"
    assert isinstance(result.result, AuditRetriesExhausted)
    assert [row.query_id for _, _, row in pa.dead_letters(tmp_path / "elsewhere" / "audit-dead-letters")] == ["other-id"]


def _logged_row(embedded, tmp_path) -> dict:
    from workers import audit
    from workers.api import search

    _store(embedded, tmp_path)
    res = search("deploy window")
    assert audit.flush(30)
    return pa.get(pa.log_of(embedded), res.query_id).model_dump(mode="json")


def test_a_malformed_row_is_quarantined_with_its_field_and_the_rest_written(embedded, tmp_path):
    from workers.app import get_app

    good = _logged_row(embedded, tmp_path)
    fresh = {**good, "query_id": "f" * 32}
    bad_text = {**good, "query_id": "b" * 32, "query_text": "lone \ud800 surrogate"}
    missing = {k: v for k, v in good.items() if k != "rrf_k"} | {"query_id": "c" * 32}
    # a dead letter is named after its query id: a path there would write outside the folder
    climbing = {**good, "query_id": "../../climbs-out"}
    not_a_number = {**good, "query_id": "d" * 32, "total_ms": float("nan")}  # would fail NOT NULL at every retry
    shifted = {**good, "query_id": "e" * 32, "logged_at": "2026-01-01T12:00:00+02:00"}  # kept as UTC
    out = get_app().tasks["audit.write"].apply(
        args=[[fresh, bad_text, missing, climbing, not_a_number, shifted, good]]).get()
    assert out == {"rows": 3, "inserted": 2, "refused": 4}  # `good` was already there
    assert pa.get(pa.log_of(embedded), "f" * 32) is not None
    assert pa.get(pa.log_of(embedded), "b" * 32) is None and pa.get(pa.log_of(embedded), "c" * 32) is None
    assert pa.get(pa.log_of(embedded), "e" * 32).logged_at == datetime(2026, 1, 1, 10, 0)
    kept = [json.loads(p.read_text()) for p in (embedded.dead_letter_dir / "invalid").glob("*.json")]
    assert sorted(k["error"].split(":")[0] for k in kept) == ["query_id", "query_text", "rrf_k", "total_ms"]
    assert pa.dead_letters(embedded.dead_letter_dir) == []  # not retried: they can never be written


def test_retry_writes_a_backlog_in_batches_and_isolates_a_failing_letter(embedded, tmp_path, monkeypatch):
    from pipeline.audit import letters as dl
    from pipeline.errors import AuditStoreUnavailable

    good = pa.AuditRecord.model_validate(_logged_row(embedded, tmp_path))
    rows = [good.model_copy(update={"query_id": f"{i:032x}"}) for i in range(250)]
    for row in rows:
        pa.dead_letter(embedded.dead_letter_dir, row, "test")
    poison = rows[123].query_id
    real_many, calls = dl.write_records, []

    def many(path, records):
        calls.append(len(records))
        if any(r.query_id == poison for r in records):
            raise AuditStoreUnavailable("the poison row's batch fails, and the row alone too")
        return real_many(path, records)

    monkeypatch.setattr(dl, "write_records", many)
    written, present, errors = pa.retry_dead_letters(embedded.dead_letter_dir, pa.log_of(embedded), batch=100)
    # one transaction per batch; the failing one (letters 100-199, the poison 24th) is halved down to
    # the poison letter, each half tried once: 15 transactions instead of 100 single letters
    assert calls == [100, 100, 50, 25, 12, 13, 6, 7, 3, 4, 2, 2, 1, 1, 25, 50, 50]
    assert (written, present) == (249, 0) and len(errors) == 1 and poison in errors[0]
    assert [r.query_id for _, _, r in pa.dead_letters(embedded.dead_letter_dir)] == [poison]
    assert pa.count(pa.log_of(embedded)) == (250, 250)  # the logged row and 249 letters


def test_retry_against_a_store_that_will_not_open_stops_at_the_first_batch(embedded, tmp_path, monkeypatch):
    """A failed batch whose store will not even open is not split: every
    letter is kept and reported with the store's error, after one try."""
    from pipeline.audit import letters as dl
    from pipeline.errors import AuditStoreUnavailable

    good = pa.AuditRecord.model_validate(_logged_row(embedded, tmp_path))
    for i in range(250):
        pa.dead_letter(embedded.dead_letter_dir, good.model_copy(update={"query_id": f"{i:032x}"}), "test")
    calls: list[int] = []

    def down(path, records):
        calls.append(len(records))
        raise AuditStoreUnavailable("cannot write audit store: it is locked")

    monkeypatch.setattr(dl, "write_records", down)
    monkeypatch.setattr(dl, "check_writable", lambda path: down(path, []))
    written, present, errors = pa.retry_dead_letters(embedded.dead_letter_dir, pa.log_of(embedded), batch=100)
    assert calls == [100, 0]  # the batch, then the store alone; no halves, no later batches
    assert (written, present, len(errors)) == (0, 0, 250)
    assert all(e.endswith(": cannot write audit store: it is locked") for e in errors)
    assert len(pa.dead_letters(embedded.dead_letter_dir)) == 250


def test_retry_moves_a_letter_that_no_longer_reads_as_a_row_aside_and_writes_the_others(
        embedded, tmp_path, monkeypatch, capsys):
    good = pa.AuditRecord.model_validate(_logged_row(embedded, tmp_path))
    for i in range(3):
        pa.dead_letter(embedded.dead_letter_dir, good.model_copy(update={"query_id": f"{i:032x}"}), "test")
    bad = embedded.dead_letter_dir / "edited-by-hand.json"
    bad.write_text(json.dumps({"error": "x", "record": {"query_id": 5}}), encoding="utf-8")
    # listing them names the file that is not a row, lists the others and moves nothing
    use_store(monkeypatch, embedded)
    from workers.settings import get_settings

    get_settings.cache_clear()
    try:
        assert main(["audit", "failed"]) == 0
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr().out
    assert "edited-by-hand.json: not an audit row (query_id: " in out
    assert "3 audit row(s) waiting" in out and "1 file(s) that are not audit rows" in out
    assert all(f"{i:032x}" in out for i in range(3)) and bad.exists()
    written, present, errors = pa.retry_dead_letters(embedded.dead_letter_dir, pa.log_of(embedded))
    assert (written, present) == (3, 0)
    assert len(errors) == 1 and errors[0].startswith("edited-by-hand.json: not an audit row (query_id: ")
    assert not bad.exists() and pa.dead_letters(embedded.dead_letter_dir) == []
    kept = list((embedded.dead_letter_dir / "invalid").glob("*.json"))
    assert len(kept) == 1 and "edited-by-hand.json" in json.loads(kept[0].read_text())["error"]


def test_a_letter_written_by_another_retry_while_the_folder_is_read_is_left_out(embedded, tmp_path, monkeypatch):
    from pipeline.audit import letters

    good = pa.AuditRecord.model_validate(_logged_row(embedded, tmp_path))
    for i in range(3):
        pa.dead_letter(embedded.dead_letter_dir, good.model_copy(update={"query_id": f"{i:032x}"}), "test")
    read = letters._read_letter

    def another_retry_got_there_first(path):
        if path.name.startswith(f"{1:032x}"):
            path.unlink()  # written and removed by a concurrent `dimple audit retry`
        return read(path)

    monkeypatch.setattr(letters, "_read_letter", another_retry_got_there_first)
    written, present, errors = pa.retry_dead_letters(embedded.dead_letter_dir, pa.log_of(embedded))
    assert (written, present, errors) == (2, 0, [])
