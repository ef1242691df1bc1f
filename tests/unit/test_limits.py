"""Input limits (settings.limits) and the bugs fuzzing found (issue 8).

Every violation is an ``InputError`` naming the field (API), a ``LineError``
naming line and field (ingest), or one line on stderr with exit code 2 (CLI).
Each ``test_regression_*`` reproduces a crash that fuzzing found: before the
fix it was an uncaught UnicodeEncodeError, RuntimeError, OverflowError,
RecursionError or TypeError, or a silently empty answer.
"""

from __future__ import annotations

import json

import pytest

from pipeline.contracts import make_query
from pipeline.errors import IngestValidationError, InputError
from pipeline.store import ingest
from tests.conftest import write_jsonl
from tests.stores import published
from workers.cli.common import ingest_file


def _limits(settings, **changes):
    return settings.replace(limits={**settings.limits.model_dump(), **changes})


def _store(settings, tmp_path, n=12):
    recs = [{"id": f"m{i}", "namespace": "ns", "content": f"note {i} about the deploy window"} for i in range(n)]
    ingest_file(write_jsonl(tmp_path / "base.jsonl", recs), settings, progress=False)


# -- query limits: settings decide, the error names the field ---------------------------
@pytest.mark.parametrize(
    "option,limit_name",
    [("max_units", "max_result_units"), ("max_chars", "max_result_chars"),
     ("max_ms", "max_query_ms"), ("top_k", "max_top_k")],
)
def test_budget_ranges_come_from_settings(settings, option, limit_name):
    s = _limits(settings, **{limit_name: 50})
    assert getattr(make_query("x", {option: 50}, s).options, option) == 50  # at the limit: fine
    with pytest.raises(InputError) as info:
        make_query("x", {option: 51}, s)
    assert info.value.field == option and "50" in info.value.reason


def test_default_limits_are_bounded(settings):
    """Safe defaults: no limit is unbounded out of the box."""
    lim = settings.limits
    assert lim.max_query_chars == 10_000 and lim.max_filter_values == 256
    assert lim.max_result_units == 10_000 and lim.max_top_k == 10_000
    assert lim.max_query_ms == 600_000 and lim.max_result_chars == 10_000_000
    assert lim.max_line_bytes == 1_048_576 and lim.max_metadata_bytes == 16_384


def test_limits_are_read_from_the_environment(monkeypatch):
    from workers.settings import WorkerSettings

    monkeypatch.setenv("DIMPLE_LIMITS__MAX_RESULT_UNITS", "7")
    assert WorkerSettings(_env_file=None).limits.max_result_units == 7




def test_metadata_limit_counts_utf8_bytes(settings, tmp_path):
    """The limit is in bytes: 3,000 'é' are 6,000+ bytes, over a 4,096-byte limit."""
    s = _limits(settings, max_metadata_bytes=4096)
    path = write_jsonl(tmp_path / "m.jsonl", [{"namespace": "a", "content": "x", "metadata": {"k": "é" * 3000}}])
    with pytest.raises(IngestValidationError) as info:
        ingest_file(path, s, progress=False)
    assert [(e.line, e.field) for e in info.value.errors] == [(1, "metadata")]
    assert "bytes, over the limit of 4096" in info.value.errors[0].reason


def test_line_limit(settings, tmp_path):
    s = _limits(settings, max_line_bytes=200)
    path = write_jsonl(tmp_path / "m.jsonl", [{"namespace": "a", "content": "y" * 300}, {"namespace": "a", "content": "ok"}])
    with pytest.raises(IngestValidationError) as info:
        ingest_file(path, s, progress=False)
    assert [(e.line, e.field) for e in info.value.errors] == [(1, "<line>")]
















BAD_INGEST_LINES = [
    # (raw line, field) -- each was an uncaught exception inside ingest before the fix
    ('{"namespace":"a","content":"x","metadata":{"k":"\\ud800"}}', "metadata"),  # RuntimeError (DuckDB cast)
    ('{"namespace":"a","content":"x","topics":["\\ud800"]}', "topics"),  # RuntimeError (DuckDB cast)
    ('{"namespace":"a","content":"x","supersedes":["\\udfff"]}', "supersedes"),
    ('{"namespace":"a","content":"x","created_at":"0001-01-01T00:00:00+05:00"}', "created_at"),  # OverflowError
    ('{"namespace":"a","content":"x","created_at":"9999-12-31T23:59:59-05:00"}', "created_at"),  # OverflowError
    ('{"namespace":"a","content":"x","metadata":' + "[" * 100_000 + "]" * 100_000 + "}", "<json>"),  # RecursionError
    # accepted before, now refused like NUL in content and namespace:
    ('{"namespace":"a","content":"x","context":"c\\u0000"}', "context"),
    ('{"namespace":"a","content":"x","id":"m\\u0000"}', "id"),
    ('{"namespace":"a","content":"x","context":"\\ud800"}', "context"),
]


@pytest.mark.parametrize("line,field", BAD_INGEST_LINES)
def test_regression_bad_ingest_line_is_reported_and_nothing_written(settings, tmp_path, line, field):
    _store(settings, tmp_path)
    before = published(settings)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"namespace": "a", "content": "fine"}) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(IngestValidationError) as info:
        ingest_file(path, settings, progress=False)
    assert [(e.line, e.field) for e in info.value.errors] == [(2, field)]
    assert published(settings) == before  # nothing written


def test_metadata_with_escaped_nul_is_stored_as_json(settings, tmp_path):
    """NUL inside a JSON string of metadata stays escaped (\\u0000) and is fine."""
    parsed = ingest.parse_lines(['{"namespace":"a","content":"x","metadata":{"k":"\\u0000"}}'], settings.limits)
    assert not parsed.errors and parsed.records[0].metadata == {"k": "\x00"}




def test_regression_line_separator_inside_a_record_is_one_line(settings, tmp_path):
    """U+2028 is legal raw inside a JSON string. ``--via-broker`` used to split the
    file with ``str.splitlines`` (which splits there), so the batch sent to the
    worker held two broken lines where validation had seen one good record."""
    from pipeline.store.ingest import read_lines
    from workers.app import get_app

    path = tmp_path / "sep.jsonl"
    path.write_text('{"id": "m-sep", "namespace": "a", "content": "first\u2028second\x85third"}\n'
                    '{"id": "m-two", "namespace": "a", "content": "other"}\r\n', encoding="utf-8")
    lines = read_lines(path)
    assert len(lines) == 2 and not ingest.read_file(path, settings.limits).errors
    import workers

    workers.configure(settings)
    out = get_app().tasks["ingest.batch"](lines, 1, False)  # what the ingest worker runs for one batch
    assert out["ok"] and out["inserted"] == 2, out


def test_option_errors_keep_pydantics_validation_error(settings):
    """The InputError names the first bad field; pydantic's full report rides along."""
    from pydantic import ValidationError

    with pytest.raises(InputError) as info:
        make_query("x", {"max_units": 0, "mode": "fuzzy", "colour": 1}, settings)
    cause = info.value.__cause__
    assert isinstance(cause, ValidationError)
    assert {e["loc"][0] for e in cause.errors()} == {"max_units", "mode", "colour"}
    assert info.value.field in {"max_units", "mode", "colour"}
