"""Read-your-writes (issue 34 item 5): a write returns the
store version it published; a search given that version as ``min_version``
answers from it or later, in any process, at once rather than after
``store.poll_ms``; a version the store does not reach within
``store.min_version_wait_ms`` is an error naming ``min_version``; every
answer and its audit row carry the version read."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.errors import InputError, VersionNotReachedError
from tests.conftest import store_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def settings(tmp_path):
    s = store_settings(tmp_path)
    s.store.poll_ms = 600_000  # a warm reader never asks on its own within a test
    return s


def _write_elsewhere(tmp_path: Path, settings, record: dict) -> int:
    """Write ``record`` from a new Python process on ``settings``' store; the version it returned."""
    script = textwrap.dedent(f"""
        from pipeline.settings import Settings
        from pipeline.store.writes import parse_records, write
        settings = Settings()
        print(write(settings, parse_records([{record!r}], settings)).version)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DIMPLE_DATA_DIR": str(settings.data_dir),
           "DIMPLE_EMBEDDING_MODEL": "hash-64"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().splitlines()[-1])


def test_a_search_with_min_version_sees_another_process_s_write_at_once(embedded, tmp_path):
    from workers.api import audit_row, remember, search

    first = remember({"id": "a", "namespace": "n", "content": "the deploy window is tuesday"})
    warm = search("deploy window", mode="keyword")  # this process now holds the store at first.version
    assert warm.store_version == first.version and [r.id for r in warm.results] == ["a"]

    version = _write_elsewhere(tmp_path, embedded, {"id": "b", "namespace": "n", "content": "a quokka in the car park"})
    assert version > first.version
    assert search("quokka", mode="keyword").results == []  # without min_version the warm reader waits out store.poll_ms
    seen = search("quokka", mode="keyword", min_version=version)
    # at least ``version``: audit batches commit snapshots of their own (retrieval_log is a lake table)
    assert [r.id for r in seen.results] == ["b"] and seen.store_version >= version
    row = audit_row(seen.query_id)
    assert row.query_profile["store_version"] == seen.store_version  # the audit row names the version read


def test_search_many_carries_min_version_to_each_query(embedded, tmp_path):
    from workers.api import remember, search_many

    remember({"id": "a", "namespace": "n", "content": "an otter by the river"})
    search_many(["otter"])
    version = _write_elsewhere(tmp_path, embedded, {"id": "b", "namespace": "n", "content": "a heron on the pier"})
    answers = search_many([{"query": "heron", "mode": "keyword", "min_version": version}, "otter"])
    assert [r.id for r in answers[0].results] == ["b"]
    assert all(a.store_version >= version for a in answers)  # audit batches commit snapshots too
    assert answers[0].store_version == answers[1].store_version  # one batch, one snapshot


def test_a_version_never_reached_is_an_error_naming_min_version_within_the_bound(embedded):
    from workers.api import remember, search

    embedded.store.min_version_wait_ms = 300
    done = remember({"id": "a", "namespace": "n", "content": "only note"})
    start = time.monotonic()
    with pytest.raises(VersionNotReachedError, match="^min_version: the store is at version") as caught:
        search("only note", min_version=done.version + 1000)
    assert caught.value.field == "min_version" and caught.value.seen == done.version
    assert 0.3 <= time.monotonic() - start < 30  # it waited its bound, and no longer than a query's timeout


def test_min_version_on_an_empty_store_is_refused_within_the_bound(embedded):
    from workers.api import search

    embedded.store.min_version_wait_ms = 50
    with pytest.raises(VersionNotReachedError, match=r"version none \(empty\), not 1,"):
        search("anything", min_version=1)


@pytest.mark.parametrize("bad", [-1, "3", 1.5, True, [1]])
def test_a_bad_min_version_is_refused_naming_the_field(embedded, bad):
    from workers.api import search

    with pytest.raises(InputError) as caught:
        search("anything", min_version=bad)
    assert caught.value.field == "min_version"


def test_get_with_min_version_sees_another_process_s_write_at_once(embedded, tmp_path):
    from workers.api import get, remember

    remember({"id": "a", "namespace": "n", "content": "the deploy window is tuesday"})
    assert [m["id"] for m in get(["a", "b"])] == ["a"]  # this process now holds the store
    version = _write_elsewhere(tmp_path, embedded, {"id": "b", "namespace": "n", "content": "a quokka in the car park"})
    assert [m["id"] for m in get(["a", "b"])] == ["a"]  # without min_version: the state held, until store.poll_ms
    assert [m["id"] for m in get(["a", "b"], min_version=version)] == ["a", "b"]
    embedded.store.min_version_wait_ms = 50
    with pytest.raises(VersionNotReachedError, match="^min_version: the store is at version"):
        get(["a"], min_version=version + 1000)


@pytest.mark.parametrize("bad", [-1, "3", 1.5, True, [1]])
def test_get_refuses_a_bad_min_version_naming_the_field(embedded, bad):
    from workers.api import get

    with pytest.raises(InputError) as caught:
        get(["a"], min_version=bad)
    assert caught.value.field == "min_version"


def test_dimple_search_takes_min_version(embedded, capsys):
    from workers.api import remember
    from workers.cli import main

    done = remember({"id": "a", "namespace": "n", "content": "the cli finds this"})
    assert main(["search", "cli finds", "--mode", "keyword", "--min-version", str(done.version), "--json"]) == 0
    assert f'"store_version": {done.version}' in capsys.readouterr().out
    embedded.store.min_version_wait_ms = 50
    assert main(["search", "cli finds", "--min-version", str(done.version + 1000)]) == 2
    assert main(["search", "cli finds", "--min-version", "-1"]) == 2
    err = capsys.readouterr().err
    assert f"min_version: the store is at version {done.version}, not {done.version + 1000}" in err
    assert "min_version: " in err.split("\n", 1)[1]


def test_a_version_never_reached_on_a_worker_reaches_the_caller_typed():
    """Celery sends a worker's error as its class and ``args`` (JSON) and rebuilds it on the caller's side."""
    from celery.backends.base import Backend

    from workers.app import get_app

    backend = Backend(app=get_app(), serializer="json")
    sent = backend.prepare_exception(VersionNotReachedError(9, 4, 250.0), serializer="json")
    got = backend.exception_to_python(sent)
    assert type(got) is VersionNotReachedError and got.field == "min_version" and (got.wanted, got.seen) == (9, 4)
    assert str(got) == "min_version: the store is at version 4, not 9, after waiting 250 ms (store.min_version_wait_ms)"


def test_a_write_through_a_reader_of_its_own_is_read_at_once_by_the_process_s_reader(settings):
    """A process reads what it wrote whichever reader wrote it: ``dimple eval``
    updates its store with a write of its own (``writes.write``, a reader of
    its own) and queries it at once through the process's reader, which polled
    the catalog moments before (within ``store.poll_ms``; here a warm reader
    never asks on its own)."""
    from pipeline.store.lake.follow import reader_for
    from pipeline.store.writes import parse_records, write

    first = write(settings, parse_records([{"id": "a", "namespace": "n", "content": "the first note"}], settings))
    reader = reader_for(settings)
    try:
        assert reader.snapshot().version == first.version
        done = write(settings, parse_records([{"id": "b", "namespace": "n", "content": "a second note"}], settings))
        assert done.version > first.version
        view = reader.snapshot()
        assert view.version >= done.version
        with view.view() as v:
            assert set(v.created_at(["a", "b"])) == {"a", "b"}
    finally:
        reader.close()
