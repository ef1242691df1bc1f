"""Finding an audit row by a unique prefix of its query id (``dimple audit show abcd``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pipeline import audit
from pipeline.errors import InputError
from pipeline.settings import Settings


def _row(query_id: str) -> audit.AuditRecord:
    return audit.AuditRecord(
        query_id=query_id, logged_at=datetime(2026, 1, 1), query_hash="0" * 16, hash_of="text", mode="keyword",
        requested_mode="keyword", query_text="q", options={}, query_profile={}, sources=[], result_count=0,
        truncated=False, total_ms=1.0, rrf_k=60,
    )


def _log(folder) -> audit.LakeLog:
    return audit.log_of(Settings(data_dir=folder, _env_file=None))


@pytest.fixture
def log(tmp_path):
    path = _log(tmp_path / "data")
    ids = ["abcd1111", "abcd2222", "abce3333", "ab%_4444", "ffff"]
    assert audit.write_records(path, [_row(i) for i in ids]) == len(ids)
    return path


def test_a_unique_prefix_finds_its_row(log):
    assert audit.find(log, "abce").query_id == "abce3333"
    assert audit.find(log, "abcd1").query_id == "abcd1111"
    assert audit.find(log, "abcd2222").query_id == "abcd2222"


def test_a_whole_id_is_found_however_short(log):
    assert audit.find(log, "ffff").query_id == "ffff"
    with pytest.raises(InputError, match="too short"):
        audit.find(log, "fff")


def test_an_ambiguous_prefix_names_the_candidates(log):
    with pytest.raises(InputError) as err:
        audit.find(log, "abcd")
    assert err.value.field == "query_id"
    assert "ambiguous" in err.value.reason and "abcd1111, abcd2222" in err.value.reason


def test_prefix_characters_are_literal_not_patterns(log):
    """``%`` and ``_`` are no wildcards: the prefix is a bound parameter of ``starts_with``."""
    assert audit.find(log, "ab%_").query_id == "ab%_4444"
    assert audit.find(log, "a%%%") is None
    assert audit.find(log, "'; DROP TABLE retrieval_log; --") is None
    assert audit.count(log) == (5, 5)


def test_no_match_or_no_log_is_none(log, tmp_path):
    assert audit.find(log, "0000") is None
    assert audit.find(_log(tmp_path / "no-audit-yet"), "abcd") is None


def test_many_candidates_are_cut(tmp_path):
    path = _log(tmp_path / "data")
    audit.write_records(path, [_row(f"beef{i:04d}") for i in range(audit.reader.SHOWN_CANDIDATES + 5)])
    with pytest.raises(InputError) as err:
        audit.find(path, "beef")
    assert err.value.reason.endswith("beef0009, ...")


def test_a_lake_no_query_was_logged_in_reads_as_empty_until_the_first_write(tmp_path):
    """A store only written to, no query logged yet: readers see no rows (not
    a catalog error), and the first write adds its row."""
    from pipeline.store.lake import Lake

    log = _log(tmp_path / "data")
    Lake.open(log.settings, embedding_model="hash-64", embedding_dim=64).close()
    assert audit.tail(log, 10) == []
    assert audit.since(log) == []
    assert audit.count(log) == (0, 0)
    assert audit.find(log, "abcd") is None
    assert audit.write_records(log, [_row("abcd1111")]) == 1
    assert [r.query_id for r in audit.tail(log, 10)] == ["abcd1111"]
    assert audit.count(log) == (1, 1)


def test_a_large_batch_is_written_in_one_commit_and_once(tmp_path):
    """A batch of 2,500 rows (a canvas of that many queries, ``query_batch_size``
    up to 10,000) is one commit (one list of JSON texts bound to one INSERT;
    a registered view of Python objects failed in DuckDB past ~1,500 rows);
    written again, it adds nothing."""
    from pipeline.audit.lake import reading
    from pipeline.store.lake.catalog import LAKE

    log = _log(tmp_path / "data")
    rows = [_row(f"big{i:05d}") for i in range(2500)]
    assert audit.write_records(log, rows[:1]) == 1

    with reading(log) as cur:
        before = cur.execute(f"SELECT count(*) FROM ducklake_snapshots('{LAKE}')").fetchone()[0]
    assert audit.write_records(log, rows) == len(rows) - 1
    with reading(log) as cur:
        after = cur.execute(f"SELECT count(*) FROM ducklake_snapshots('{LAKE}')").fetchone()[0]
    assert after == before + 1  # one commit
    assert audit.count(log) == (len(rows), len(rows))
    assert audit.write_records(log, rows) == 0
    assert audit.find(log, "big02499").query_id == "big02499"


def test_a_row_reads_back_as_it_was_written(tmp_path):
    """Every column comes back as the record held it: text in any script, JSON
    nested, floats small and large, nulls, an empty latency map."""
    log = _log(tmp_path / "data")
    full = _row("full").model_copy(update={
        "query_text": "Встреча в Москве — 東京の会議 \"quoted\" \\ back",
        "options": {"scope": {"namespace": "работа", "topics": ["a/b"]}, "now": "2026-01-01T00:00:00"},
        "query_profile": {"legs": {"fts": {"ran": True, "top_scores": [1e-07, 12345.678901, 0.0]}},
                          "store_version": None},
        "sources": [{"id": "m-東京", "rank": 1, "ranks": {"fts": 1}, "rrf": 0.016393, "recency_factor": None}],
        "truncated": True, "truncation": {"by": "maxUnits", "left_out": 3, "limit": 2, "detail": None},
        "latency_ms": {"fulltext": 0.25, "budget": 0.0125}, "total_ms": 3.5, "rrf_k": 60,
        "logged_at": datetime(2026, 1, 1, 12, 30, 45, 123456)})
    bare = _row("bare").model_copy(update={"query_text": None, "latency_ms": {}})
    assert audit.write_records(log, [full, bare]) == 2
    assert audit.get(log, "full") == full
    assert audit.get(log, "bare") == bare


def test_a_row_sent_again_among_new_ones_is_stored_once_whatever_else_the_log_holds(tmp_path):
    """A row sent again (same query id, same logged_at) among new rows, with
    rows logged long before and after it in other commits, is found and not
    stored twice; only the new ones go in."""
    log = _log(tmp_path / "data")
    at = datetime(2026, 6, 1, 12, 0, 0)
    old = [_row(f"old{i}").model_copy(update={"logged_at": datetime(2026, 1, 1 + i)}) for i in range(3)]
    late = [_row(f"late{i}").model_copy(update={"logged_at": datetime(2026, 12, 1 + i)}) for i in range(3)]
    sent = _row("sent").model_copy(update={"logged_at": at})
    for batch in (old, [sent], late):  # three commits, three data files or inlined groups
        assert audit.write_records(log, batch) == len(batch)
    new = [_row(f"new{i}").model_copy(update={"logged_at": datetime(2026, 6, 1, 11, 59, i)}) for i in range(2)]
    assert audit.write_records(log, new + [sent]) == 2
    assert audit.write_records(log, [sent]) == 0
    assert audit.count(log) == (9, 9)
    # a row whose time carries an offset (a producer of its own on the audit queue), sent twice
    # among naive ones: found again, however the batch's times compare
    offset = _row("offset").model_copy(update={"logged_at": datetime(2026, 6, 1, 13, 0, tzinfo=timezone(timedelta(hours=5)))})
    assert audit.write_records(log, [offset, _row("n1").model_copy(update={"logged_at": at})]) == 2
    assert audit.write_records(log, [_row("n2").model_copy(update={"logged_at": datetime(2026, 6, 1, 12, 30)}),
                                     offset]) == 1
    assert audit.count(log) == (12, 12)


def test_a_catalog_error_opening_the_log_is_a_typed_audit_error_and_the_next_write_attaches_afresh(tmp_path, monkeypatch):
    """A DuckDB error while a process first readies the log (its catalog
    unreadable for a moment) is ``AuditStoreUnavailable``, which ``audit.write``
    retries and then dead-letters; a raw ``duckdb.Error`` failed the task
    unretried, its message acknowledged and its rows lost. The connection is
    not reused: the next write attaches again and goes in."""
    import duckdb

    from pipeline.audit import lake
    from pipeline.errors import AuditStoreUnavailable

    log = _log(tmp_path / "data")
    real = lake._has_log

    def unreadable(cur):
        raise duckdb.IOException("IO Error: could not read the catalog")

    monkeypatch.setattr(lake, "_has_log", unreadable)
    with pytest.raises(AuditStoreUnavailable, match="could not read the catalog"):
        audit.write_records(log, [_row("first")])
    assert log not in lake._CONNECTIONS.open
    monkeypatch.setattr(lake, "_has_log", real)
    assert audit.write_records(log, [_row("first")]) == 1
    assert audit.find(log, "first").query_id == "first"
