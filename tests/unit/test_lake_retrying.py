"""``pipeline.store.lake.commit.retrying``: a step refused because its
transaction was aborted by an earlier failure is rolled back and run again,
however DuckDB reports it (a ``TransactionException``, or a streamed result's
``InvalidInputException`` when fetched, as DuckLake's maintenance functions
report a conflict); any other error is raised at once."""

from __future__ import annotations

import duckdb
import pytest

from pipeline.store.lake.catalog import _is_conflict
from pipeline.store.lake.commit import retrying


def _aborted() -> duckdb.DuckDBPyConnection:
    """A connection whose open transaction a failed statement aborted."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (i INTEGER PRIMARY KEY)")
    con.execute("INSERT INTO t VALUES (1)")
    con.execute("BEGIN")
    with pytest.raises(duckdb.ConstraintException):
        con.execute("INSERT INTO t VALUES (1)")
    return con


def test_an_aborted_transaction_is_rolled_back_and_the_step_run_again():
    con = _aborted()
    assert retrying(con, lambda: con.execute("SELECT count(*) FROM t").fetchall(), deadline_s=5, what="x") == ([(1,)], 2)


def test_aborted_as_a_fetch_error_counts_as_a_conflict_and_other_errors_do_not():
    fetched = duckdb.InvalidInputException("Invalid Input Error: Attempting to fetch from an unsuccessful query result\n"
                                           "Error: TransactionContext Error: Current transaction is aborted "
                                           "(please ROLLBACK)")
    assert _is_conflict(fetched)
    assert not _is_conflict(duckdb.InvalidInputException("Invalid Input Error: the lake's path is wrong"))
    con = duckdb.connect()
    calls = []

    def wrong():
        calls.append(1)
        con.execute("SELECT * FROM no_such_table")

    with pytest.raises(duckdb.CatalogException):
        retrying(con, wrong, deadline_s=5, what="x")
    assert len(calls) == 1  # raised at once, not retried


def test_a_step_stopped_between_begin_and_commit_leaves_no_transaction_open():
    """A Celery soft time limit (``SoftTimeLimitExceeded``, not a DuckDB error)
    raised inside a write's transaction: the transaction is rolled back, so
    the process's connection neither keeps the uncommitted rows in view nor
    refuses its next BEGIN."""
    from celery.exceptions import SoftTimeLimitExceeded

    con = duckdb.connect()
    con.execute("CREATE TABLE t (i INTEGER)")

    def stopped():
        con.execute("BEGIN")
        con.execute("INSERT INTO t VALUES (1)")
        raise SoftTimeLimitExceeded()

    with pytest.raises(SoftTimeLimitExceeded):
        retrying(con, stopped, deadline_s=5, what="x")
    assert con.execute("SELECT count(*) FROM t").fetchone() == (0,)
    con.execute("BEGIN")  # no transaction was left open
    con.execute("COMMIT")
