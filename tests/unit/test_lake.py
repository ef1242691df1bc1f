"""The lake (pipeline.store.lake) in one process, on its default SQLite
catalog: settings, writes as transactions, idempotent write ids, reading an
old snapshot, the changes between snapshots, and erasing for good. Several
processes at once, and PostgreSQL: tests/integration/test_lake_catalogs.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from pipeline.errors import InputError, StoreError
from pipeline.settings import Settings
from pipeline.store.lake import LakeWrite
from pipeline.store.lake.catalog import Catalog
from pipeline.store.lake.follow import Follower, listed, own_write
from tests.lakes import DIM, files_holding, memory, open_lake
from workers.settings import WorkerSettings, mask_url


@pytest.fixture
def lake_settings(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path / "data", _env_file=None)


@pytest.fixture
def lake(lake_settings):
    with open_lake(lake_settings) as opened:
        yield opened


def test_the_lake_lives_in_the_data_dir_unless_told_otherwise(tmp_path, monkeypatch):
    settings = Settings(data_dir=tmp_path, _env_file=None)
    assert settings.lake_catalog == f"sqlite:{tmp_path / 'lake.sqlite'}"
    assert settings.lake_data_path == tmp_path / "lake"
    assert settings.store.retain == timedelta(days=7)
    monkeypatch.setenv("DIMPLE_STORE__CATALOG", "postgres:dbname=dimple host=db user=dimple password=s3cret")
    monkeypatch.setenv("DIMPLE_STORE__DATA_PATH", str(tmp_path / "shared"))
    monkeypatch.setenv("DIMPLE_STORE__RETAIN", "P2D")
    settings = Settings(data_dir=tmp_path, _env_file=None)
    assert settings.lake_catalog.startswith("postgres:dbname=dimple")
    assert settings.lake_data_path == tmp_path / "shared"
    assert settings.store.retain == timedelta(days=2)
    assert "s3cret" not in str(Catalog.parse(settings.lake_catalog))


@pytest.mark.parametrize("value", ["mysql:dbname=x", "postgres:", "sqlite", "lake.sqlite"])
def test_a_bad_catalog_is_refused_naming_the_field(monkeypatch, value):
    monkeypatch.setenv("DIMPLE_STORE__CATALOG", value)
    with pytest.raises(ValidationError) as err:
        Settings(_env_file=None)
    assert [e["loc"] for e in err.value.errors()] == [("store", "catalog")]
    assert "sqlite:PATH" in str(err.value)


def test_a_non_positive_retention_is_refused(monkeypatch):
    monkeypatch.setenv("DIMPLE_STORE__RETAIN", "0")
    with pytest.raises(ValidationError) as err:
        Settings(_env_file=None)
    assert [e["loc"] for e in err.value.errors()] == [("store", "retain")]


def test_catalog_passwords_are_masked_in_messages_and_in_dimple_config(monkeypatch):
    assert mask_url("postgres:dbname=d password=hunter2 host=h") == "postgres:dbname=d password=**** host=h"
    assert mask_url("postgres:password='a b' dbname=d") == "postgres:password=**** dbname=d"
    assert mask_url("postgres:postgresql://me:hunter2@db/d") == "postgres:postgresql://me:****@db/d"
    monkeypatch.setenv("DIMPLE_STORE__CATALOG", "postgres:dbname=d host=h password=hunter2")
    shown = WorkerSettings(_env_file=None).masked()["store"]
    assert shown["catalog"] == "postgres:dbname=d host=h password=****"


def test_an_unreachable_catalog_is_a_store_error_naming_the_field(tmp_path):
    settings = Settings(data_dir=tmp_path, store={"catalog": "postgres:dbname=x host=127.0.0.1 port=1 user=nobody "
                                                              "password=hunter2 connect_timeout=2"}, _env_file=None)
    with pytest.raises(StoreError, match="^store.catalog: cannot open the lake catalog") as err:
        open_lake(settings)
    assert "hunter2" not in str(err.value)


def test_another_data_path_is_a_store_error_naming_the_field(lake_settings, tmp_path):
    open_lake(lake_settings).close()
    moved = lake_settings.replace(store={"data_path": tmp_path / "elsewhere"})
    with pytest.raises(StoreError, match="^store.data_path: "):
        open_lake(moved)


def test_a_lake_of_another_dimension_is_refused(lake_settings):
    open_lake(lake_settings).close()
    from pipeline.store.lake import Lake

    with pytest.raises(StoreError, match=f"holds {DIM}-d embeddings"):
        Lake.open(lake_settings, embedding_dim=DIM * 2)


def test_a_write_is_one_snapshot_and_reads_back_as_written(lake):
    before = lake.latest_snapshot()
    done = lake.commit(LakeWrite([
        memory("a", "We deploy on Fridays.", topics=["deploy"], concepts=["friday"], metadata={"k": [1, 2]},
               context="asked in #ops", created_at=datetime(2025, 1, 10, 9, tzinfo=UTC)),
        memory("b", "No deploys on Fridays any more.", supersedes=["a"], supported_by=["c"]),
    ], write_id="w-1"))
    assert done.snapshot == lake.latest_snapshot() == before + 1 and not done.replayed
    a, b = lake.read()
    assert (a.id, a.content, a.topics, a.concepts, a.metadata, a.context, a.created_at) == (
        "a", "We deploy on Fridays.", ["deploy"], ["friday"], {"k": [1, 2]}, "asked in #ops", datetime(2025, 1, 10, 9))
    assert a.embedding.shape == (DIM,) and abs(float(a.embedding @ a.embedding) - 1) < 1e-5
    assert sorted(b.edges) == [("b", "a", "supersedes"), ("c", "b", "supports")]
    assert lake.written("w-1") == done.snapshot and lake.written("w-2") is None


def test_a_write_delivered_again_is_applied_once(lake):
    first = lake.commit(LakeWrite([memory("a", "one")], write_id="msg-1"))
    lake.commit(LakeWrite([memory("b", "two")], write_id="msg-2"))
    again = lake.commit(LakeWrite([memory("a", "one, changed since")], write_id="msg-1"))
    assert again.replayed and again.snapshot == first.snapshot
    assert [m.content for m in lake.read()] == ["one", "two"]
    rows = lake.con.execute("SELECT write_id, count(*) FROM writes GROUP BY 1 ORDER BY 1").fetchall()
    assert rows == [("msg-1", 1), ("msg-2", 1)]


def test_a_write_whose_base_another_listed_first_answers_its_replay_the_same(lake, lake_settings):
    """A reader or a compaction can build and list the base of a write's
    snapshot before the write lists it: the write's answer (the snapshot that
    lists its base) and its replay's are still one snapshot."""
    done = lake.commit(LakeWrite([memory("a", "one")], write_id="msg-1"))
    follower = Follower(lake_settings)
    try:
        path, first = follower.build_listed(done.snapshot)  # a reader's build, at the same snapshot
        again, published = follower.build_listed(done.snapshot, "msg-1")
        assert again == path and published > first > done.snapshot
        assert lake.written("msg-1") == published
        assert lake.commit(LakeWrite([memory("a", "one")], write_id="msg-1")).snapshot == published
        assert list(listed(lake)) == [done.snapshot]
    finally:
        follower.close()


def test_remembering_an_id_again_replaces_it_and_forgetting_drops_its_links(lake):
    lake.commit(LakeWrite([memory("a", "old text", topics=["x"]), memory("b", "links to a", supersedes=["a"])]))
    lake.commit(LakeWrite([memory("a", "new text", topics=["y"])]))
    assert [(m.id, m.content, m.topics) for m in lake.read(ids=["a"])] == [("a", "new text", ["y"])]
    done = lake.commit(LakeWrite(forget=["a", "missing"]))
    assert done.forgotten == 1
    assert [(m.id, m.edges) for m in lake.read()] == [("b", [])]


def test_a_write_may_not_both_remember_and_forget_an_id():
    with pytest.raises(ValueError, match="both"):
        LakeWrite([memory("a", "x")], forget=["a"])


def test_time_travel_reads_the_store_as_it_was(lake):
    one = lake.commit(LakeWrite([memory("a", "first version")])).snapshot
    then = datetime.now(UTC)
    lake.commit(LakeWrite([memory("a", "second version"), memory("b", "later")]))
    lake.commit(LakeWrite(forget=["b"]))
    assert [(m.id, m.content) for m in lake.read(at=one)] == [("a", "first version")]
    assert [(m.id, m.content) for m in lake.read(at=then)] == [("a", "first version")]
    assert lake.snapshot_at(then) == one
    assert [(m.id, m.content) for m in lake.read()] == [("a", "second version")]
    assert lake.count(at=one + 1) == 2 and lake.count() == 1
    with pytest.raises(InputError, match="^as_of: no snapshot"):
        lake.read(at=lake.latest_snapshot() + 5)


def test_changes_since_lists_exactly_the_inserts_and_deletes(lake):
    lake.commit(LakeWrite([memory("a", "a"), memory("b", "b", topics=["t"])]))
    since = lake.latest_snapshot()
    s1 = lake.commit(LakeWrite([memory("c", "c", supersedes=["a"])])).snapshot
    s2 = lake.commit(LakeWrite([memory("b", "b changed")])).snapshot
    s3 = lake.commit(LakeWrite(forget=["a"])).snapshot
    changes = lake.changes_since(since)
    assert (changes.since, changes.until) == (since, s3)
    memories = changes.tables["memories"]
    assert [(s, r["id"], r["content"]) for s, r in memories.inserted] == [(s1, "c", "c"), (s2, "b", "b changed")]
    assert [(s, r["id"], r["content"]) for s, r in memories.deleted] == [(s2, "b", "b"), (s3, "a", "a")]
    assert [(s, r["memory_id"]) for s, r in changes.tables["memory_topics"].deleted] == [(s2, "b")]
    assert [(s, r["src"], r["dst"]) for s, r in changes.tables["edges"].inserted] == [(s1, "c", "a")]
    assert [(s, r["src"], r["dst"]) for s, r in changes.tables["edges"].deleted] == [(s3, "c", "a")]
    assert changes.ids("inserted") == ["c", "b"] and changes.ids("deleted") == ["b", "a"]
    assert lake.changes_since(s3).tables["memories"].inserted == []
    assert lake.changes_since(s1, until=s2).ids("inserted") == ["b"]


def test_erase_leaves_no_byte_of_the_text_in_any_file(lake, lake_settings):
    secret = "ZQX the vault code is 7341"
    # one small write (inlined in the catalog), one large (a Parquet file), and
    # texts sorting before and after it (a file's min/max statistics)
    lake.commit(LakeWrite([memory("s1", secret, context=f"{secret} again"), memory("k1", "keep me")]))
    lake.commit(LakeWrite([memory(f"bulk-{i}", f"bulk memory {i}") for i in range(40)]
                          + [memory("s2", f"{secret} in bulk", metadata={"note": secret})]))
    lake.commit(LakeWrite([memory("first", "!!! sorts first"), memory("last", "~~~ sorts last")]))
    old = lake.latest_snapshot()
    folders = (lake_settings.data_dir,)
    assert files_holding(secret.encode(), *folders), "the scan finds the text before the erase"
    purged = lake.erase(["s1", "s2"])
    assert purged.snapshot > old and purged.expired > 0
    assert files_holding(secret.encode(), *folders) == []
    assert files_holding(b"vault code", *folders) == []
    with pytest.raises(InputError, match="^as_of: no snapshot"):
        lake.read(at=old)
    assert lake.count() == 43
    assert {m.id for m in lake.read(ids=["k1", "bulk-3", "s1", "s2"])} == {"k1", "bulk-3"}
    lake.commit(LakeWrite([memory("after", "written after the erase")]))
    assert lake.count() == 44


def test_a_read_whose_snapshot_an_erase_expires_meanwhile_is_read_again_or_refused(lake, lake_settings, monkeypatch):
    """Another process's erase expires every older snapshot, and the catalog
    deletes their rows under reads still going: a read at such a snapshot
    comes back short, without an error (an empty ``lake_meta`` or
    ``memories``). No test can place the cut inside one statement, so the
    other process erases here just after a read's last statement: the latest
    point the read's check must still catch. Reading the latest, the read
    reads again; reading a snapshot asked for, it is refused."""
    from pipeline.store.lake import read as reads

    lake.commit(LakeWrite([memory("s1", "the vault code"), memory("k1", "keep me")]))
    run, pending = reads._run, [["s1"]]

    def erase_after_the_last_statement(con, sql, params):
        rows = run(con, sql, params)
        if sql.startswith("SELECT src, dst") and pending:  # the edges: read_memories' last
            with open_lake(lake_settings) as other:
                other.erase(pending.pop())
        return rows

    monkeypatch.setattr(reads, "_run", erase_after_the_last_statement)
    assert [m.id for m in lake.read()] == ["k1"]  # read again, at the erase's snapshot
    lake.commit(LakeWrite([memory("s2", "more of the vault")]))
    at = lake.latest_snapshot()
    pending.append(["s2"])
    with pytest.raises(reads.Cut, match=f"snapshot {at} of the lake expired while memories was read"):
        lake.read(at=at)
    assert not pending and [m.id for m in lake.read(ids=["k1", "s2"])] == ["k1"]


def test_a_read_whose_pinned_snapshot_an_erase_expires_before_its_first_statement_reads_again(
        lake, lake_settings, monkeypatch):
    """The erase lands between the read pinning the latest snapshot and its
    first statement: DuckLake then says there is no such snapshot. Reading
    the latest, that is an erase's cut, read again (CI saw a reader beside
    an erase fail with "as_of: no snapshot of the lake at 5", an option it
    never gave); reading a snapshot asked for, it is the caller's as_of."""
    from pipeline.store.lake import read as reads

    lake.commit(LakeWrite([memory("s1", "the vault code"), memory("k1", "keep me")]))
    latest, pending = reads.latest_snapshot, [["s1"]]

    def erase_after_pinning(con):
        pinned = latest(con)
        if pending:
            with open_lake(lake_settings) as other:
                other.erase(pending.pop())
        return pinned

    monkeypatch.setattr(reads, "latest_snapshot", erase_after_pinning)
    assert [m.id for m in lake.read()] == ["k1"] and not pending  # read again, at the erase's snapshot
    monkeypatch.undo()
    lake.commit(LakeWrite([memory("s2", "more of the vault")]))
    gone = lake.latest_snapshot()
    with open_lake(lake_settings) as other:
        other.erase(["s2"])
    with pytest.raises(reads.SnapshotGone, match=f"^as_of: no snapshot of the lake at {gone} "):
        lake.read(at=gone)


def test_expire_keeps_the_retained_snapshots(lake):
    first = lake.commit(LakeWrite([memory("a", "a")])).snapshot
    lake.commit(LakeWrite([memory("b", "b")]))
    assert lake.expire().expired == 0  # a week: nothing is that old
    assert lake.count(at=first) == 1


def test_only_audit_commits_since_a_snapshot_and_a_gap_is_not_taken_for_one(lake):
    from pipeline.store.lake.catalog import LAKE
    from pipeline.store.lake.commit import AUDIT_MESSAGE, only_audit_since

    def audit_commit() -> int:  # a commit that writes no record table, as the audit trail's
        lake.con.execute("BEGIN TRANSACTION")
        lake.con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', ?)", [AUDIT_MESSAGE])
        lake.con.execute("UPDATE write_head SET seq = seq")
        lake.con.execute("COMMIT")
        return lake.latest_snapshot()

    first = lake.commit(LakeWrite([memory("a", "alpha")])).snapshot
    quiet = [audit_commit() for _ in range(3)]
    assert quiet == [first + 1, first + 2, first + 3]
    assert only_audit_since(lake.con, first, quiet[-1]) and only_audit_since(lake.con, first, first)
    second = lake.commit(LakeWrite([memory("b", "beta")])).snapshot
    assert not only_audit_since(lake.con, first, second)
    last = audit_commit()
    assert only_audit_since(lake.con, second, last)
    lake.con.execute(f"SELECT * FROM ducklake_expire_snapshots('{LAKE}', versions => [{first + 2}])").fetchall()
    assert not only_audit_since(lake.con, first, quiet[-1])  # an expired snapshot's changes are unknown


class _Counting:
    """A lake connection that keeps the statements run on it."""

    def __init__(self, con):
        self.con, self.sql = con, []

    def execute(self, sql, *args):
        self.sql.append(sql)
        return self.con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.con, name)


def test_a_poll_runs_nothing_on_the_lake_and_a_follow_reads_only_the_changed_tables(lake_settings, lake):
    """On a SQLite catalog DuckLake reads the whole snapshot table at each
    transaction's first statement (85 ms at 600,000 snapshots, a busy week:
    ``ops.bench.catalog_cost``). A search process's poll with nothing new,
    or only audit commits since, asks the catalog alone and runs no
    statement on the lake; bringing its view up to a write of memories reads
    the changes of the tables it wrote, and no base listing (``indexes``)."""
    from pipeline.store.lake.catalog import LAKE, ask

    lake.commit(LakeWrite([memory("a", "alpha")]))
    follower = Follower(lake_settings)
    try:
        view = follower.follow(follower.follow(None, fresh=True), fresh=True)  # past the snapshot listing its base
        own = follower.lake()
        assert view is not None and own is not None
        counting = own.con = _Counting(own.con)
        ask(counting, "SELECT 1")  # its catalog kind, asked once
        counting.sql.clear()
        assert follower.follow(view, fresh=True) is view and counting.sql == []
        lake.con.execute("BEGIN TRANSACTION")  # an audit commit: no record table written
        lake.con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'audit')")
        lake.con.execute("UPDATE write_head SET seq = seq")
        lake.con.execute("COMMIT")
        assert follower.follow(view, fresh=True) is view and counting.sql == []
        done = lake.commit(LakeWrite([memory("b", "beta")]))
        later = follower.follow(view, fresh=True)
        assert later is not None and later.version == done.snapshot
        # the one record table the write changed (no topics, concepts or edges), only the way it
        # changed it (inserted, none deleted), and no `indexes`
        assert len(counting.sql) == 1 and "ducklake_table_insertions" in counting.sql[0], counting.sql
        replaced = lake.commit(LakeWrite([memory("b", "beta again")]))  # a delete and an insert of `b`
        counting.sql.clear()
        again = follower.follow(later, fresh=True)
        assert again is not None and again.version == replaced.snapshot
        assert [("deletions" in q, "insertions" in q) for q in counting.sql] == [(True, False), (False, True)]
        assert again.overlay.members["b"].content == "beta again"
    finally:
        follower.close()


def _as_read(m):
    return (m.id, m.namespace, m.content, m.content_type, m.created_at, m.content_hash, m.embedding.tobytes(),
            json.dumps(m.metadata), m.context, m.topics, m.concepts, m.edges)


def test_a_write_seen_by_its_own_process_is_what_the_lake_reads_back(lake):
    # the follower extends its view by its own write (follow.own_write) instead of reading the
    # changes back: what it builds must be exactly what changes_since reads
    lake.commit(LakeWrite([memory("a", "old text", topics=["x"]), memory("c", "a target")]))
    write = LakeWrite([
        memory("b", "links to a", supersedes=["a"], topics=["z", "b", "m"], concepts=["q", "p"],
               metadata={"z": 1, "a": {"y": [1.5, "é"], "b": None}}, context="ctx",
               created_at=datetime(2025, 1, 10, 9, 30, 1, 123456, tzinfo=UTC)),
        memory("a", "new text", topics=["y"], supported_by=["c"], conflicts=["b"]),
    ])
    done = lake.commit(write)
    (read,) = lake.changes_since(done.snapshot - 1).writes(DIM)
    own = own_write(write, done.snapshot)
    assert own is not None and (own.snapshot, own.forgotten, own.unlinked) == (read.snapshot, [], [])
    assert [_as_read(m) for m in own.remembered] == [_as_read(m) for m in read.remembered]
    assert own_write(LakeWrite([memory("d", "x")], forget=["c"]), done.snapshot + 1) is None  # a forget: read back


def test_a_base_read_while_a_compaction_moves_the_files_is_read_again_not_rebuilt(lake, lake_settings, monkeypatch):
    """A compaction's flush or merge committing while a process opens the
    listed base (``Cut``, its snapshot not expired) makes it read again, as
    ``follow`` does at its next poll: no whole base built in the foreground and
    listed for every host, and an ``as_of`` of a readable snapshot answered."""
    from pipeline.store.lake import follow as following
    from pipeline.store.lake.read import Cut

    done = lake.commit(LakeWrite([memory("a", "alpha")]))
    first = Follower(lake_settings)
    try:
        first.build_listed(done.snapshot)
    finally:
        first.close()
    real, cuts = following.open_view, []

    def moved_once(*args, **kwargs):
        if len(cuts) < 2:
            cuts.append(1)
            raise Cut("the lake's files moved as they were read", expired=False)
        return real(*args, **kwargs)

    monkeypatch.setattr(following, "open_view", moved_once)
    follower = Follower(lake_settings)
    try:
        view = follower.follow(None, fresh=True)
        assert view is not None and sorted(view.overlay.ids) == [] and view.store is not None
        assert list(listed(lake)) == [done.snapshot]  # no base of its own built and listed
        cuts.clear()
        past = follower.view_at(done.snapshot)
        assert past.store is not None and list(listed(lake)) == [done.snapshot]
        past.close()
        view.close()
    finally:
        follower.close()


def test_a_base_listed_while_another_loads_is_loaded_after_it(lake, lake_settings, monkeypatch):
    """Compactions list bases B then C while a process loads B in the
    background: once B is in use C is loaded too (its listing was read while
    B loaded, and is not read again), not left until some later listing."""
    import threading

    from pipeline.store.lake import follow as following

    first = lake.commit(LakeWrite([memory("a", "alpha")]))
    builder = Follower(lake_settings)
    follower = Follower(lake_settings)
    go, opened = threading.Event(), following.Snapshot.open

    def slow_open(*args, **kwargs):
        if threading.current_thread().name == "dimple-lake-base-load":
            go.wait(60)
        return opened(*args, **kwargs)

    try:
        builder.build_listed(first.snapshot)
        view = follower.follow(None, fresh=True)
        assert view is not None and follower.newest_base() == first.snapshot
        monkeypatch.setattr(following.Snapshot, "open", slow_open)
        b = lake.commit(LakeWrite([memory("b", "beta")]))
        builder.build_listed(b.snapshot)
        view = follower.follow(view, fresh=True)  # B listed: loading, held back
        c = lake.commit(LakeWrite([memory("c", "gamma")]))
        builder.build_listed(c.snapshot)
        view = follower.follow(view, fresh=True)  # C listed while B loads
        assert follower.newest_base() == c.snapshot
        go.set()
        follower.wait_ready(60)
        view = follower.follow(view, fresh=True)  # B in use, C loading
        assert view is not None and view.base is not None and view.base.endswith(f"base-{b.snapshot}.duckdb")
        follower.wait_ready(60)
        view = follower.follow(view, fresh=True)
        assert view is not None and view.base is not None and view.base.endswith(f"base-{c.snapshot}.duckdb")
        assert sorted(view.overlay.ids) == []  # every memory in C itself
    finally:
        go.set()
        follower.close()
        builder.close()
