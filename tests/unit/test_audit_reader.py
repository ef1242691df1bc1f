"""Finding an audit row by a unique prefix of its query id (``dimple audit show abcd``)."""

from __future__ import annotations

from datetime import datetime

import pytest

from pipeline import audit
from pipeline.errors import InputError


def _row(query_id: str) -> audit.AuditRecord:
    return audit.AuditRecord(
        query_id=query_id, logged_at=datetime(2026, 1, 1), query_hash="0" * 16, hash_of="text", mode="keyword",
        requested_mode="keyword", query_text="q", options={}, query_profile={}, sources=[], result_count=0,
        truncated=False, total_ms=1.0, rrf_k=60,
    )


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "audit.duckdb"
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
    assert audit.find(tmp_path / "missing.duckdb", "abcd") is None


def test_many_candidates_are_cut(tmp_path):
    path = tmp_path / "audit.duckdb"
    audit.write_records(path, [_row(f"beef{i:04d}") for i in range(audit.reader.SHOWN_CANDIDATES + 5)])
    with pytest.raises(InputError) as err:
        audit.find(path, "beef")
    assert err.value.reason.endswith("beef0009, ...")


def test_a_file_without_the_table_reads_as_empty_until_the_first_write(tmp_path):
    """A writer killed between creating the file and committing the schema
    leaves a bare DuckDB file: readers see no rows (not a catalog error), and
    the next write creates the table and its row."""
    import duckdb

    path = tmp_path / "audit.duckdb"
    duckdb.connect(str(path)).close()
    assert path.exists()
    assert audit.tail(path, 10) == []
    assert audit.since(path) == []
    assert audit.count(path) == (0, 0)
    assert audit.find(path, "abcd") is None
    assert audit.write_records(path, [_row("abcd1111")]) == 1
    assert [r.query_id for r in audit.tail(path, 10)] == ["abcd1111"]
    assert audit.count(path) == (1, 1)


def test_a_row_is_found_while_this_process_writer_holds_the_file(tmp_path):
    """Embedded, the process that just answered a query holds the audit file
    open for writing (``explain_miss`` right after ``search``): the reader
    knocks, the writer lets go, and the row is read."""
    path = tmp_path / "audit.duckdb"
    writer = audit.AuditWriter(idle_s=600, max_hold_s=600)
    try:
        assert writer.write(path, [_row("held0001")]) == 1
        assert writer.holding
        assert audit.find(path, "held0001").query_id == "held0001"
    finally:
        writer.release()
