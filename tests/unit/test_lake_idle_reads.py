"""A process that has read a SQLite catalog and sits idle holds no read
transaction on it. One left open (a result not read to its end) pins the
WAL: every process's ``wal_checkpoint`` then stays busy, so the erase's
emptying of the WAL fails after its bound and the WAL grows while the
process idles (a search worker between queries, say)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pipeline.store.lake.follow import Follower
from pipeline.store.lake.store import Lake
from pipeline.store.tuned import read_tuned
from pipeline.store.writes import parse_records, write
from tests.conftest import store_settings

# another process's checkpoint, as the erase's: busy (1) while a reader pins the WAL
CHECKPOINT = ("import sqlite3, sys; db = sqlite3.connect(sys.argv[1], timeout=2); "
              "print(db.execute('PRAGMA wal_checkpoint(TRUNCATE)').fetchone()[0])")


def _busy(catalog: Path) -> int:
    done = subprocess.run([sys.executable, "-c", CHECKPOINT, str(catalog)], capture_output=True, text=True, check=True)
    return int(done.stdout)


def _remember(settings, *ids: str):
    return write(settings, parse_records([{"id": i, "namespace": "n", "content": f"note {i}"} for i in ids], settings))


def test_idle_readers_of_the_catalog_leave_its_wal_free(tmp_path):
    settings = store_settings(tmp_path)
    first = _remember(settings, "a", "b")
    write(settings, forget=["a"])
    catalog = Path(settings.lake_catalog.removeprefix("sqlite:"))
    lake, follower = Lake.open(settings), Follower(settings)
    try:
        # what writers, readers and the workers' checks ask of the catalog
        lake.latest_snapshot()
        assert lake.written("no such write") is None
        assert follower.follow(None, fresh=True) is not None
        assert follower.latest() >= first.version
        assert follower.erase_due(fresh=True) is False
        assert read_tuned(settings, follower) is None
        _remember(settings, "c")  # committed after their reads: frames their snapshot does not hold
        assert _busy(catalog) == 0
        lake.latest_snapshot()  # and again, with the WAL empty
        _remember(settings, "d")
        assert _busy(catalog) == 0
    finally:
        lake.close()
        follower.close()

