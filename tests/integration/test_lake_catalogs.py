"""The lake with several processes writing at once, on both catalogs: the
default SQLite file and PostgreSQL (a database of its own per test run,
created and dropped; the server found or started by ``tests.lakes.find_postgres``,
else these tests skip naming what to install)."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline.settings import Settings
from pipeline.store.lake import LakeWrite
from tests.lakes import (
    age_forgets,
    compact_erasing,
    erase_in_child,
    files_holding,
    find_postgres,
    memory,
    open_lake,
    polling,
    writers,
)

PROCESSES = ["p0", "p1", "p2"]
OWN = 12  # writes of its own per process
SHARED = 8  # writes every process sends (one message delivered to each)


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    server = find_postgres(tmp_path_factory.mktemp("postgres"))
    yield server
    if server.proc is not None:
        server.proc.terminate()
        server.proc.wait(timeout=30)


@pytest.fixture
def pg_catalog(postgres):
    conninfo = postgres.create_database()
    yield conninfo
    postgres.drop_database(conninfo)


def _sqlite(tmp_path) -> Settings:
    return Settings(data_dir=tmp_path / "data", _env_file=None)


def _postgres(tmp_path, conninfo: str) -> Settings:
    return Settings(data_dir=tmp_path / "host", store={"catalog": f"postgres:{conninfo}",
                                                      "data_path": tmp_path / "shared"}, _env_file=None)


def _every_write_once(settings: Settings, tmp_path) -> None:
    open_lake(settings).close()  # the lake's tables exist before the writers race
    results = writers(settings, PROCESSES, OWN, SHARED, tmp_path)
    expected = {f"{p}-{j}" for p in PROCESSES for j in range(OWN)} | {f"shared-{j}" for j in range(SHARED)}
    with open_lake(settings) as lake:
        ids = Counter(m.id for m in lake.read())
        writes = Counter(r[0] for r in lake.con.execute("SELECT write_id FROM writes").fetchall())
    assert set(ids) == expected and max(ids.values()) == 1, "every write present, none twice"
    assert set(writes) == expected and max(writes.values()) == 1
    # each shared message applied by exactly one process; the others were told it was a replay
    applied = Counter(r["id"] for rs in results for r in rs if not r["replayed"])
    assert applied == Counter(expected)
    replayed = Counter(r["id"] for rs in results for r in rs if r["replayed"])
    assert replayed == Counter({f"shared-{j}": len(PROCESSES) - 1 for j in range(SHARED)})
    # a replay answers with the snapshot that holds the write
    first = {r["id"]: r["snapshot"] for rs in results for r in rs if not r["replayed"]}
    assert all(r["snapshot"] == first[r["id"]] for rs in results for r in rs if r["replayed"])
    assert len(set(first.values())) == len(first), "one snapshot per write"
    assert sum(r["attempts"] for rs in results for r in rs) >= len(expected)


@pytest.mark.slow  # processes racing, ~10 s each (the default tier keeps tests/embedded/test_lake_write_race.py)
def test_processes_writing_at_once_to_a_sqlite_catalog_lose_nothing_and_apply_nothing_twice(tmp_path):
    _every_write_once(_sqlite(tmp_path), tmp_path)


@pytest.mark.slow  # processes racing, ~10 s each (the default tier keeps tests/embedded/test_lake_write_race.py)
def test_processes_writing_at_once_to_a_postgres_catalog_lose_nothing_and_apply_nothing_twice(tmp_path, pg_catalog):
    _every_write_once(_postgres(tmp_path, pg_catalog), tmp_path)


def test_a_write_is_visible_to_another_process_at_its_snapshot(tmp_path, pg_catalog):
    settings = _postgres(tmp_path, pg_catalog)
    with open_lake(settings) as writer, open_lake(settings.replace(data_dir=tmp_path / "host2")) as reader:
        seen = reader.latest_snapshot()
        done = writer.commit(LakeWrite([memory("a", "from the other host")]))
        assert reader.latest_snapshot() == done.snapshot
        assert reader.changes_since(seen).ids("inserted") == ["a"]
        assert [m.content for m in reader.read(at=seen)] == []
        assert [m.content for m in reader.read(at=done.snapshot)] == ["from the other host"]


def test_erase_on_a_postgres_catalog_leaves_no_byte_in_files_or_catalog(tmp_path, postgres, pg_catalog):
    settings = _postgres(tmp_path, pg_catalog)
    secret = "ZQX the vault code is 7341"
    with open_lake(settings) as lake:
        lake.commit(LakeWrite([memory("s1", secret), memory("k1", "keep me")]))
        lake.commit(LakeWrite([memory(f"bulk-{i}", f"bulk memory {i}") for i in range(40)]
                              + [memory("s2", f"{secret} in bulk", context=secret)]))
        old = lake.latest_snapshot()
        assert secret in postgres.dump(pg_catalog), "the small write's rows are inlined in the catalog"
        assert files_holding(secret.encode(), tmp_path / "shared"), "the large write's are in a Parquet file"
        lake.erase(["s1", "s2"])
        assert files_holding(secret.encode(), tmp_path) == []
        assert "vault code" not in postgres.dump(pg_catalog)
        with pytest.raises(Exception, match="as_of: no snapshot"):
            lake.read(at=old)
        assert lake.count() == 41


@pytest.mark.parametrize("catalog", ["sqlite", "postgres"])
def test_erase_while_another_process_reads_without_pause(tmp_path, request, catalog):
    """The catalog's clean-up (VACUUM, the WAL checkpoint) waits for a reader
    instead of failing it or leaving the bytes, and the reader goes on."""
    if catalog == "sqlite":  # one host: the reader shares the data dir
        settings = reader = _sqlite(tmp_path)
    else:  # another host: its own data dir, the same catalog and data path
        settings = _postgres(tmp_path, request.getfixturevalue("pg_catalog"))
        reader = settings.replace(data_dir=tmp_path / "reader")
    secret = "ZQX the vault code is 7341"
    with open_lake(settings) as lake:
        lake.commit(LakeWrite([memory("s1", secret), memory("k1", "keep me")]))
        lake.commit(LakeWrite([memory(f"bulk-{i}", f"bulk memory {i} {secret}") for i in range(20)]))
        finish = polling(reader, tmp_path)
        erase_in_child(settings, ["s1"] + [f"bulk-{i}" for i in range(20)])
        after = lake.latest_snapshot()
        lake.commit(LakeWrite([memory("k2", "written after")]))
        read = finish()
        assert files_holding(secret.encode(), tmp_path) == []
        assert read["reads"] > 0 and read["snapshots"][-1] > after, "the reader read on, through the erase"
        assert [m.id for m in lake.read()] == ["k1", "k2"]


@pytest.mark.slow
@pytest.mark.parametrize("catalog", ["sqlite", "postgres"])
def test_a_read_beside_compactions_is_never_short(tmp_path, request, catalog):
    """Each of compaction's steps (flush, rewrite, merge) moves a table's
    files in one commit; a read at the same moment must still read every
    memory of its snapshot. On a SQLite catalog, before reads checked
    (``read.settled``), 4 of 401 reads beside 60 compactions here each missed
    a memory, without an error."""
    from pipeline.store.lake import erase

    if catalog == "sqlite":
        settings = reader = _sqlite(tmp_path)
    else:
        settings = _postgres(tmp_path, request.getfixturevalue("pg_catalog"))
        reader = settings.replace(data_dir=tmp_path / "reader")
    with open_lake(settings) as lake:
        lake.commit(LakeWrite([memory("first", "the first note")]))
        finish = polling(reader, tmp_path)
        for i in range(40):
            lake.commit(LakeWrite([memory(f"m{i}", f"note {i}")]))
            erase.rewrite(lake.con, deadline_s=settings.write_wait_s)
        read = finish()
        assert lake.count() == 41
    assert read["reads"] > 40 and read["fell"] == 0, read


def test_compaction_on_a_postgres_catalog_erases_a_due_forget_and_another_host_loads_its_base(
        tmp_path, postgres, pg_catalog):
    """Two hosts (data dirs of their own; one catalog, one data path, one index
    path): one host compacts with an erase due; no file and no catalog row keeps
    the text, and the other host's reader loads the base it listed."""
    from pipeline.store.lake.follow import reader_for
    from pipeline.store.writes import parse_records, write
    from tests.conftest import store_settings

    def host(name: str):
        settings = store_settings(tmp_path / name)
        settings.store.catalog = f"postgres:{pg_catalog}"
        settings.store.data_path = tmp_path / "shared"
        settings.store.index_path = tmp_path / "indexes"
        return settings

    one, two = host("one"), host("two")
    secret = "ZQX the vault code is 7341"
    write(one, parse_records([{"id": "s1", "namespace": "n", "content": secret}]
                             + [{"id": f"k{i}", "namespace": "n", "content": f"keep note {i}"} for i in range(12)], one))
    write(one, parse_records({"id": "s2", "namespace": "n", "content": f"{secret} again"}, one))
    reader = reader_for(two)  # the other host, warm on the first base
    try:
        assert reader.snapshot() is not None
        write(one, forget=["s1", "s2"])
        age_forgets(one)  # as if forgotten an hour ago (the default store.erase_within)
        report = compact_erasing(one)
        assert report.ran and report.forgotten == 1
        assert files_holding(secret.encode(), tmp_path) == []
        assert "vault code" not in postgres.dump(pg_catalog)
        reader.wait_ready()
        snap = reader.snapshot(fresh=True)
        assert snap.base == str(tmp_path / "indexes" / report.base)
        assert [p.name for p in (tmp_path / "indexes").iterdir()] == [report.base]
        assert snap.store.count() == 12
    finally:
        reader.close()


def test_a_shared_data_path_mounted_elsewhere_is_repointed_on_a_postgres_catalog(tmp_path, pg_catalog):
    """The catalog on the server, the files on a shared volume now mounted at
    another path: refused with ``store.data_path`` until ``repoint``, then every
    memory read back from the new path."""
    from pipeline.errors import StoreError
    from pipeline.store.lake.repoint import repoint

    settings = _postgres(tmp_path, pg_catalog)
    with open_lake(settings) as lake:
        lake.commit(LakeWrite([memory(f"m{i}", f"note {i} on the shared volume") for i in range(30)]))
        ids = sorted(m.id for m in lake.read())
    moved = settings.replace(store=settings.store.model_copy(update={"data_path": tmp_path / "mounted", "engine": "lake"}))
    (tmp_path / "shared").rename(tmp_path / "mounted")
    with pytest.raises(StoreError, match=r"^store\.data_path: .*dimple repoint"):
        open_lake(moved)
    done = repoint(moved)
    assert done.changed and done.checked and done.files >= 1 and done.new == f"{tmp_path / 'mounted'}/"
    with open_lake(moved) as lake:
        assert sorted(m.id for m in lake.read()) == ids


def test_files_a_merge_replaced_stay_an_hour_on_a_postgres_catalog(tmp_path, pg_catalog):
    """PostgreSQL compares ``schedule_start`` exactly: the routine clean-up's
    cutoff is ``now - LONGEST_TRANSACTION`` there (on SQLite it keeps the day:
    ``tests/unit/test_lake_cleanup.py``), and the files a merge replaced a
    moment ago stay, while a reader that planned before the merge reads them."""
    from datetime import UTC, datetime, timedelta

    from pipeline.store.lake.catalog import LAKE, META
    from pipeline.store.lake.erase import LONGEST_TRANSACTION, cleanup_cutoff

    settings = _postgres(tmp_path, pg_catalog)
    with open_lake(settings) as lake:
        for k in range(3):
            lake.commit(LakeWrite([memory(f"m{k}-{i}", f"text {k} {i}") for i in range(30)]))
        before, files = lake.latest_snapshot(), set(settings.lake_data_path.rglob("*.parquet"))
        lake.con.execute(f"SELECT * FROM ducklake_merge_adjacent_files('{LAKE}')").fetchall()
        now = datetime.now(UTC)
        assert cleanup_cutoff(lake.con, lake.catalog, now) == now - LONGEST_TRANSACTION
        listed = lake.con.execute(f"SELECT * FROM ducklake_cleanup_old_files('{LAKE}', dry_run => true, "
                                  "older_than => ?::TIMESTAMPTZ)", [now - timedelta(minutes=1)]).fetchall()
        assert listed == []  # scheduled a moment ago: not older than a minute ago
        assert lake.expire().files_deleted == 0 and files <= set(settings.lake_data_path.rglob("*.parquet"))
        assert lake.count(at=before) == 90
        lake.con.execute(f"UPDATE {META}.ducklake_files_scheduled_for_deletion SET schedule_start = ?::TIMESTAMPTZ",
                         [now - LONGEST_TRANSACTION - timedelta(minutes=5)])
        assert lake.expire().files_deleted == 3 and not files & set(settings.lake_data_path.rglob("*.parquet"))
        assert lake.count(at=before) == 90
