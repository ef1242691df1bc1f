"""Input limits (settings.limits) and the bugs fuzzing found (issue 8).

The tests of this concern for the in-process canvas (the embedded tier); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_limits.py``.
"""

from __future__ import annotations

import pytest

from pipeline.errors import InputError
from tests.conftest import use_store
from tests.unit.test_limits import _limits, _store  # noqa: F401  (helpers and fixtures shared with the unit tests)
from workers.cli import main


def test_search_many_batch_size_is_checked(embedded):
    from workers.api import search_many

    s = _limits(embedded, max_batch_queries=4)
    import workers

    workers.configure(s)
    for bad in (0, -1, 5, "3", 2.5, True):
        with pytest.raises(InputError) as info:
            search_many(["a", "b"], batch_size=bad)
        assert info.value.field == "batch_size"
    assert len(search_many(["a", "b", "c", "d", "e"], batch_size=4)) == 5  # two canvases, in order


def test_search_many_checks_every_query_before_it_sends_any_and_names_the_bad_one(embedded):
    """Was: the batches before a bad query were sent (embedded: run and
    audited) before its error, which named the field but not the query."""
    from workers.api import search_many

    answered: list[int] = []
    with pytest.raises(InputError) as info:
        search_many(["alpha", "beta", "gamma", "delta", {"query": "epsilon", "max_units": 0}], batch_size=2,
                    progress=answered.append)
    assert info.value.field == "queries[4].max_units" and "max_units" in str(info.value)
    assert answered == []  # no batch ran


@pytest.mark.parametrize(("item", "field"), [
    ({"mode": "keyword"}, "queries[1].query"),
    (123, "queries[1]"),
    (("b",), "queries[1]"),
    ({"query": "b", "text": "c"}, "queries[1].text"),
])
def test_search_many_names_the_query_that_is_not_one(embedded, item, field):
    from workers.api import search_many

    with pytest.raises(InputError) as info:
        search_many(["a", item])
    assert info.value.field == field


@pytest.mark.parametrize("bad", [0, -1, "4", 2.5, True])
def test_search_many_in_flight_is_checked(embedded, bad):
    from workers.api import search_many

    with pytest.raises(InputError) as info:
        search_many(["a", "b"], in_flight=bad)
    assert info.value.field == "in_flight"


def test_a_handles_wait_is_its_get(embedded):
    from workers.api import remember, remember_async, search_async

    remember({"id": "a", "namespace": "n", "content": "the deploy window is friday"})
    got = search_async("deploy window").wait(timeout=10)  # Results, as get() gives them
    assert [r.id for r in got.results] == ["a"]
    written = remember_async({"id": "b", "namespace": "n", "content": "the rollback plan"}).wait(timeout=10)
    assert written.ids == ["b"] and written.inserted == 1


def test_search_many_puts_what_a_stage_refused_in_each_of_its_queries_places(embedded):
    """With ``return_exceptions``, a batch a stage refused (a snapshot the lake
    does not hold) is reported per query, typed and naming the query; the
    other batches are answered. Was: the error ended the whole call."""
    from pipeline.contracts import Results
    from workers.api import remember, search_many

    done = remember({"id": "a", "namespace": "n", "content": "alpha"})
    out = search_many([{"query": "alpha", "mode": "keyword", "as_of": done.version + 5},
                       {"query": "alpha", "mode": "keyword"}], batch_size=1, return_exceptions=True)
    assert isinstance(out[0], InputError) and out[0].field == "queries[0].as_of"
    assert f"no snapshot {done.version + 5}" in str(out[0])
    assert isinstance(out[1], Results) and [r.id for r in out[1].results] == ["a"]


# -- CLI: one line, exit code 2 ------------------------------------------------------------
@pytest.mark.parametrize(
    "argv,needle",
    [
        (["search"], "required: query"),
        (["search", "x", "--max-units", "abc"], "--max-units"),
        (["search", "x", "--max-units", "999999999"], "max_units"),
        (["search", "x", "--max-ms", "0"], "max_ms"),
        (["search", "x", "--recency-boost", "nan"], "recency_boost"),
        (["search", "x", "--now", "0001-01-01T00:00:00+05:00"], "now"),
        (["search", "x", "--namespace", "a\x00b"], "namespace"),
        (["search", "bad \udcff argv"], "query"),  # a non-UTF-8 argv byte (surrogateescape)
        (["nonsense"], "invalid choice"),
        (["audit", "tail", "-n", "x"], "-n"),
    ],
)
def test_cli_bad_arguments_are_one_line_and_exit_2(embedded, monkeypatch, capsys, argv, needle):
    use_store(monkeypatch, embedded)
    from workers.settings import get_settings

    get_settings.cache_clear()
    try:
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("dimple: error:") and needle in err[0], err

# -- regressions found by fuzzing ---------------------------------------------------------
def test_regression_lone_surrogate_in_query_is_an_input_error(embedded, tmp_path):
    """Was: UnicodeEncodeError from the embedder / DuckDB."""
    from workers.api import search

    _store(embedded, tmp_path)
    with pytest.raises(InputError) as info:
        search("deploy \ud800")
    assert info.value.field == "query" and "Unicode" in info.value.reason


@pytest.mark.parametrize("option", ["topics", "concepts", "content_type"])
def test_regression_lone_surrogate_in_a_filter_is_an_input_error(embedded, tmp_path, option):
    """Was: RuntimeError 'Unable to cast Python instance' from DuckDB's binder."""
    from workers.api import search

    _store(embedded, tmp_path)
    with pytest.raises(InputError) as info:
        search("deploy", **{option: ["ok", "\udc80bad"]})
    assert info.value.field == option


def test_regression_nul_in_query_namespace_is_an_input_error(embedded):
    """Ingest refuses NUL in a namespace; a query now does too (was: accepted silently)."""
    from workers.api import search

    with pytest.raises(InputError) as info:
        search("deploy", namespace="a\x00b")
    assert info.value.field == "namespace"


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"])
def test_regression_now_out_of_range_in_utc_is_an_input_error(embedded, when):
    """Was: OverflowError from astimezone()."""
    from workers.api import search

    with pytest.raises(InputError) as info:
        search("deploy", now=when, recency_boost=1)
    assert info.value.field == "now"


@pytest.mark.parametrize("bad", [0, -1, "x"])
def test_regression_search_many_bad_batch_size(embedded, bad):
    """Was: -1 returned [] for one query (answers silently lost), 'x' a TypeError."""
    from workers.api import search_many

    with pytest.raises(InputError) as info:
        search_many(["deploy"], batch_size=bad)
    assert info.value.field == "batch_size"


def test_regression_search_many_of_a_non_list(embedded):
    """Was: TypeError 'int' object is not iterable; a bare string ran one query per character."""
    from workers.api import search_many

    for bad in (5, "deploy window"):
        with pytest.raises(InputError) as info:
            search_many(bad)
        assert info.value.field == "queries"


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["ingest", "x" * 300], "cannot read"),  # was: OSError 'File name too long' (a traceback)
        (["ingest", "no\nsuch\x85file"], "no such file: no\\nsuch\\x85file"),  # was: three lines
        (["ingest", "bad\udcffname"], "bad\\udcffname"),  # was: UnicodeEncodeError while printing the error
        (["ingest", "\u202eevil"], "\\u202eevil"),  # a right-to-left override cannot disguise the line
        (["search", "x", "--bogus", "a\nb"], "a\\nb"),
    ],
)
def test_regression_cli_error_is_one_printable_line(embedded, monkeypatch, capsys, argv, needle):
    use_store(monkeypatch, embedded)
    from workers.settings import get_settings

    get_settings.cache_clear()
    try:
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()  # splitlines: any line break at all counts
    assert len(lines) == 1 and needle in lines[0], err
    assert all(c.isprintable() for c in lines[0])
