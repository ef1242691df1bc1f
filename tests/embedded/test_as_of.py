"""``search(..., as_of=S)`` on the lake (issue 34 item 5, second half): the
answer is the store as it was at snapshot S, memories forgotten since left
out."""

from __future__ import annotations

import pytest

from pipeline.errors import InputError


def _ids(query: str, **options) -> list[str]:
    from workers.api import search

    return sorted(r.id for r in search(query, mode="keyword", **options).results)


def test_as_of_answers_as_the_store_was_then_without_what_was_forgotten_since(embedded):
    from workers.api import audit_row, forget, remember, search

    first = remember([{"id": "a", "namespace": "n", "content": "the office is in lisbon"},
                      {"id": "b", "namespace": "n", "content": "the office cat is called lisbon"}])
    moved = remember({"id": "a", "namespace": "n", "content": "the office moved to porto"})
    remember({"id": "c", "namespace": "n", "content": "a second office in lisbon"})
    forget("b")
    assert _ids("lisbon") == ["c"]
    assert _ids("lisbon", as_of=first.version) == ["a"]  # b was forgotten since: never served again
    assert _ids("porto", as_of=first.version) == [] and _ids("porto", as_of=moved.version) == ["a"]
    then = search("office", mode="keyword", as_of=moved.version)
    assert then.store_version == moved.version and sorted(r.id for r in then.results) == ["a"]
    assert audit_row(then.query_id).query_profile["store_version"] == moved.version
    assert _ids("lisbon") == ["c"]  # the newest state is untouched


def test_as_of_in_one_batch_reads_one_snapshot(embedded):
    from workers.api import remember, search_many

    first = remember({"id": "a", "namespace": "n", "content": "alpha"})
    remember({"id": "b", "namespace": "n", "content": "beta"})
    same = search_many([{"query": "beta", "mode": "keyword", "as_of": first.version},
                        {"query": "alpha", "mode": "keyword", "as_of": first.version}])
    assert [[r.id for r in a.results] for a in same] == [[], ["a"]]
    with pytest.raises(InputError) as caught:
        search_many([{"query": "beta", "as_of": first.version}, "alpha"])
    assert caught.value.field == "as_of"


@pytest.mark.parametrize("bad", [0, -1, "3", 1.5, True])
def test_a_bad_as_of_is_refused_naming_the_field(embedded, bad):
    from workers.api import remember, search

    remember({"id": "a", "namespace": "n", "content": "alpha"})
    with pytest.raises(InputError) as caught:
        search("alpha", as_of=bad)
    assert caught.value.field == "as_of"


def test_a_snapshot_the_lake_does_not_hold_is_refused_naming_as_of(embedded):
    from workers.api import remember, search

    done = remember({"id": "a", "namespace": "n", "content": "alpha"})
    with pytest.raises(InputError, match=f"^as_of: no snapshot {done.version + 5} in the lake"):
        search("alpha", as_of=done.version + 5)


def test_dimple_search_takes_as_of(embedded, capsys):
    from workers.api import remember
    from workers.cli import main

    first = remember({"id": "a", "namespace": "n", "content": "the cli finds this"})
    remember({"id": "b", "namespace": "n", "content": "the cli finds that too"})
    assert main(["search", "cli finds", "--mode", "keyword", "--as-of", str(first.version), "--json"]) == 0
    out = capsys.readouterr().out
    assert '"id": "a"' in out and '"id": "b"' not in out
    assert main(["search", "cli finds", "--as-of", "0"]) == 2 and "as_of" in capsys.readouterr().err


def test_without_a_base_at_or_before_it_as_of_builds_one_there(embedded):
    from pipeline.store.lake.follow import base_file, bases
    from workers.api import forget, remember

    remember({"id": "a", "namespace": "n", "content": "alpha note"})
    second = remember({"id": "b", "namespace": "n", "content": "beta note"})
    forget("a")
    for path in bases(embedded).values():  # as on a host that never built one (its first write's is gone)
        path.unlink()
    assert _ids("note", as_of=second.version) == ["b"]  # a was live then, and is forgotten since
    assert list(bases(embedded)) == [second.version] and base_file(embedded, second.version).exists()


def test_audit_explain_replays_a_logged_query_at_the_snapshot_it_read(embedded):
    """On the lake a logged query is replayed at its own snapshot (issue 32):
    ``explain``'s diff shows what a setting change did, not what later writes
    did, and why-not answers as the store was then."""
    from workers.api import explain, explain_miss, remember, search

    remember([{"id": "a", "namespace": "n", "content": "the deploy window is friday"},
              {"id": "b", "namespace": "n", "content": "deploy notes for the window"}])
    asked = search("deploy window", mode="keyword")
    assert [r.id for r in asked.results] and "c" not in [r.id for r in asked.results]
    remember({"id": "c", "namespace": "n", "content": "deploy window: the deploy window moved, deploy window"})
    assert search("deploy window", mode="keyword").results[0].id == "c"  # a later write leads now
    replay = explain(asked.query_id)["replay"]
    assert replay["replayed_at"] == asked.store_version
    assert replay["verdict"] == "same list" and replay["changes"] == [] and replay["store_changed"] is None
    with pytest.raises(InputError) as caught:  # c was not in the store the query read
        explain_miss(asked.query_id, "c")
    assert caught.value.field == "memory_id"
    assert explain_miss(asked.query_id, asked.results[0].id).reason == "returned"


def test_as_of_a_time_answers_as_the_last_snapshot_committed_by_then(embedded, capsys, monkeypatch):
    import time
    from datetime import UTC, datetime, timedelta

    from pipeline.store.lake import follow
    from workers.api import audit_row, remember, search
    from workers.cli.commands import main

    with pytest.raises(InputError, match=r"^as_of: .* is less than 10 s ago"):  # the default: settled times only
        search("office", as_of=datetime.now(UTC) - timedelta(seconds=2))
    monkeypatch.setattr(follow, "AS_OF_SETTLED", timedelta(0))  # times a test can wait for

    first = remember({"id": "a", "namespace": "n", "content": "the office is in lisbon"})
    time.sleep(0.05)
    between = datetime.now(UTC)
    time.sleep(0.05)
    moved = remember({"id": "a", "namespace": "n", "content": "the office moved to porto"})
    assert moved.version > first.version
    then = search("office", mode="keyword", as_of=between)
    assert then.store_version == first.version and [r.id for r in then.results] == ["a"]
    assert "lisbon" in then.results[0].content
    assert audit_row(then.query_id).query_profile["store_version"] == first.version
    # naive ISO text is UTC; the same time as text and as a datetime read the same snapshot
    naive = between.replace(tzinfo=None).isoformat()
    assert search("lisbon", mode="keyword", as_of=naive).store_version == first.version
    assert _ids("porto", as_of=datetime.now(UTC)) == ["a"]
    with pytest.raises(InputError, match="^as_of: .* is in the future"):
        search("office", as_of=datetime.now(UTC) + timedelta(hours=1))
    with pytest.raises(InputError, match="^as_of: no snapshot of the lake at or before"):
        search("office", as_of="2001-01-01T00:00:00")
    with pytest.raises(InputError) as caught:
        search("office", as_of="last tuesday")
    assert caught.value.field == "as_of"
    capsys.readouterr()
    assert main(["search", "office", "--mode", "keyword", "--as-of", naive]) == 0
    assert "lisbon" in capsys.readouterr().out


def test_a_memory_forgotten_after_an_as_of_query_is_not_served_by_the_next_one(embedded):
    from workers.api import forget, remember

    first = remember([{"id": "a", "namespace": "n", "content": "the office is in lisbon"},
                      {"id": "b", "namespace": "n", "content": "the office cat is called lisbon"}])
    assert _ids("lisbon", as_of=first.version) == ["a", "b"]  # this process now holds a view of S
    assert _ids("lisbon", as_of=first.version) == ["a", "b"]  # and reuses it (audit commits in between)
    forget("b")
    assert _ids("lisbon", as_of=first.version) == ["a"]  # forgotten since: never served again


def test_dimple_search_as_of_checks_the_namespaces_the_store_held_then(embedded, capsys):
    """A namespace whose one memory moved to another (rewritten there), the
    move compacted, is unknown now and known at a snapshot that held it."""
    from pipeline.store.lake.compaction import compact_lake
    from workers import resources
    from workers.api import remember
    from workers.cli import main

    then = remember([{"id": "a", "namespace": "archive", "content": "the old office lease"},
                     {"id": "b", "namespace": "n", "content": "the new office lease"}]).version
    remember({"id": "a", "namespace": "n", "content": "the old office lease"})
    compact_lake(embedded, wait=True)
    resources.current().close_store()
    assert main(["search", "office lease", "--namespace", "archive"]) == 2
    assert "no namespace 'archive' in the store" in capsys.readouterr().err
    assert main(["search", "office lease", "--mode", "keyword", "--namespace", "archive", "--as-of", str(then),
                 "--json"]) == 0
    out = capsys.readouterr().out
    assert '"id": "a"' in out and '"id": "b"' not in out
