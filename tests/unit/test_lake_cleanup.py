"""The routine clean-up after a compaction (``erase.expire``) leaves the files
a merge replaced until no read can still need them (``LONGEST_TRANSACTION``).

DuckLake's ``ducklake_merge_adjacent_files`` schedules the files it replaced
for deletion at once (time travel reads the merged file). Deleted at once,
a reader that planned its scan before the merge failed with "Cannot open
file" (a write on three hosts, ``ops/bench/host_kills.py``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pipeline.settings import Settings
from pipeline.store.lake.catalog import LAKE, META
from pipeline.store.lake.erase import LONGEST_TRANSACTION, cleanup_cutoff
from pipeline.store.lake.records import LakeWrite
from tests.lakes import memory, open_lake


@pytest.fixture
def lake(tmp_path):
    with open_lake(Settings(data_dir=tmp_path / "data", _env_file=None)) as opened:
        yield opened


def _parquet(lake) -> set[Path]:
    return set(lake.settings.lake_data_path.rglob("*.parquet"))


def _merged(lake) -> tuple[int, set[Path]]:
    """Three commits of 30 memories each (past inlining: a file each), then a
    merge: the snapshot before it and the files it replaced."""
    for k in range(3):
        lake.commit(LakeWrite([memory(f"m{k}-{i}", f"text {k} {i}") for i in range(30)]))
    before, files = lake.latest_snapshot(), _parquet(lake)
    lake.con.execute(f"SELECT * FROM ducklake_merge_adjacent_files('{LAKE}')").fetchall()
    assert len(files) == 3 and len(_parquet(lake) - files) == 1, "the merge wrote one file for three"
    return before, files


def test_files_a_merge_replaced_stay_until_no_read_can_need_them(lake):
    before, replaced = _merged(lake)
    # a reader that planned its scan before the merge reads these very files
    planned = lake.con.execute(f"SELECT count(*) FROM {LAKE}.memories AT (VERSION => ?)", [before]).fetchall()
    assert lake.expire().files_deleted == 0
    assert replaced <= _parquet(lake)
    assert planned == [(90,)] and lake.count(at=before) == 90 and lake.count() == 90
    # once replaced longer ago than any read runs, the next clean-up deletes them
    lake.con.execute(f"UPDATE {META}.ducklake_files_scheduled_for_deletion SET schedule_start = ?",
                     [(datetime.now(UTC) - LONGEST_TRANSACTION - timedelta(days=2)).isoformat(sep=" ")])
    assert lake.expire().files_deleted == 3
    assert not replaced & _parquet(lake)
    assert lake.count(at=before) == 90 and lake.count() == 90  # the merged file serves every snapshot


def test_duckdb_on_a_sqlite_catalog_compares_the_schedule_by_day(lake):
    """Why ``cleanup_cutoff`` keeps the whole day on SQLite: DuckLake 1.5.5
    takes a file scheduled at any time today for one scheduled at midnight. If
    this stops holding, the cutoff may be ``now - LONGEST_TRANSACTION`` there too."""
    _merged(lake)
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)

    def listed(older_than: datetime) -> int:
        return len(lake.con.execute(f"SELECT * FROM ducklake_cleanup_old_files('{LAKE}', dry_run => true, "
                                    "older_than => ?::TIMESTAMPTZ)", [older_than]).fetchall())

    assert listed(today - timedelta(microseconds=1)) == 0
    assert listed(today + timedelta(microseconds=1)) == 3  # scheduled a moment ago, after midnight


def test_the_cutoff_keeps_the_day_of_the_youngest_replaced_file_on_sqlite(lake):
    now = datetime.now(UTC)
    assert cleanup_cutoff(lake.con, lake.catalog, now) == now - LONGEST_TRANSACTION  # nothing scheduled
    _merged(lake)
    young = lake.con.execute(f"SELECT min(schedule_start::TIMESTAMPTZ) FROM {META}."
                             "ducklake_files_scheduled_for_deletion").fetchall()[0][0]
    midnight = young.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    cutoff = cleanup_cutoff(lake.con, lake.catalog, now)
    assert cutoff < midnight and cutoff <= now - LONGEST_TRANSACTION
    later = now + LONGEST_TRANSACTION + timedelta(days=3)  # every replaced file is old by then
    assert cleanup_cutoff(lake.con, lake.catalog, later) == later - LONGEST_TRANSACTION


def test_expire_keeps_what_retain_keeps_to_the_second_on_sqlite(tmp_path):
    """``store.retain`` of an hour: a snapshot of 30 minutes ago stays readable
    and one of two hours ago goes, whatever the time of day (DuckLake's own
    ``older_than`` on SQLite compares by day: at 04:00 it expired everything
    since midnight)."""
    from datetime import UTC, datetime, timedelta

    settings = Settings(data_dir=tmp_path / "data", store={"retain": "PT1H"}, _env_file=None)
    with open_lake(settings) as lake:
        snaps = [lake.commit(LakeWrite([memory(f"m{k}", f"text {k}")])).snapshot for k in range(4)]
        now = datetime.now(UTC)
        stamp = {snaps[0]: now - timedelta(hours=2, minutes=1), snaps[1]: now - timedelta(hours=2),
                 snaps[2]: now - timedelta(minutes=30)}
        for snap, at in stamp.items():
            lake.con.execute(f"UPDATE {META}.ducklake_snapshot SET snapshot_time = ? WHERE snapshot_id = ?",
                             [at.isoformat(sep=" "), snap])
        gone = lake.expire().expired
        alive = {int(r[0]) for r in lake.con.execute(f"SELECT snapshot_id FROM ducklake_snapshots('{LAKE}')").fetchall()}
        assert snaps[2] in alive and snaps[3] in alive
        assert snaps[0] not in alive and snaps[1] not in alive and gone >= 2
        assert lake.count(at=snaps[2]) == 3 and lake.count() == 4
