"""What a search process's polls and reads, and a write, cost as a lake's
snapshots grow, on each catalog.

    python -m ops.bench.catalog_cost --snapshots 0 100000 600000
    python -m ops.bench.catalog_cost --snapshots 0 600000 --postgres 'host=127.0.0.1 user=postgres'

A fresh lake (a SQLite catalog in a temporary folder; with ``--postgres``, a
PostgreSQL database made for the run and dropped after) is given N extra rows
in DuckLake's ``ducklake_snapshot`` and ``ducklake_snapshot_changes`` tables
(ids below the lake's own, so DuckLake's view of the lake is unchanged: a
busy week at ``store.retain`` keeps ~600,000, most of them audit commits).
Timed in one process, best of 5 unless said:

- ``ducklake``: the baseline, DuckLake's own ``ducklake_current_snapshot()``:
  how ``latest_snapshot`` asked before, and what DuckLake pays at the first
  statement of every transaction (on SQLite it reads the snapshot table whole);
- ``latest``: ``latest_snapshot()`` now (``catalog.ask``, by key);
- ``settled``: ``read.settled``, the check after every read;
- ``idle poll``: a search process's poll with nothing new (``Follower.follow``);
- ``commit``: a one-memory write (median of 5);
- ``follow``: a search process bringing its view up to another connection's
  one-memory write (``Follower.follow``: the changes read; median of 5);
- ``read``: a whole read of the lake (``Lake.read``: ``lake_meta`` and the
  four record tables at one snapshot).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ops.bench import emit, postgres_lake


def _best(step: Callable[[], object], rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return round(min(times) * 1000, 2)


def _pad(settings, n: int) -> None:
    """N snapshot rows below the lake's own, written to its closed catalog."""
    from pipeline.store.lake.catalog import Catalog

    catalog = Catalog.parse(settings.lake_catalog)
    if catalog.kind == "sqlite":
        db = sqlite3.connect(catalog.target)
        db.execute("INSERT INTO ducklake_snapshot WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g "
                   "WHERE i < ?) SELECT -i, '2026-01-01 00:00:00+00', 0, 0, 0 FROM g", [n])
        db.execute("INSERT INTO ducklake_snapshot_changes WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
                   "FROM g WHERE i < ?) SELECT -i, 'inlined_insert:1', NULL, 'audit', NULL FROM g", [n])
        db.commit()
        db.close()
        return
    from pipeline.store.lake.catalog import connect, load_extensions

    con = connect()
    load_extensions(con, catalog, settings.data_dir / "duckdb-extensions", ducklake=False)
    con.execute(f"ATTACH '{catalog.target}' AS pg (TYPE postgres)")
    for sql in (f"INSERT INTO ducklake_snapshot SELECT -g, '2026-01-01 00:00:00+00', 0, 0, 0 "
                f"FROM generate_series(1, {int(n)}) g",
                f"INSERT INTO ducklake_snapshot_changes SELECT -g, 'inlined_insert:1', NULL, 'audit', NULL "
                f"FROM generate_series(1, {int(n)}) g",
                "ANALYZE ducklake_snapshot, ducklake_snapshot_changes"):  # as autovacuum would, before long
        con.execute("CALL postgres_execute('pg', ?)", [sql])
    con.close()


def measure(settings, n: int) -> dict:
    from pipeline.store.lake import Lake, LakeWrite
    from pipeline.store.lake import read as reads
    from pipeline.store.lake.catalog import LAKE
    from pipeline.store.lake.follow import Follower
    from tests.lakes import memory, open_lake

    open_lake(settings).close()
    if n:
        _pad(settings, n)
    follower = Follower(settings)
    with open_lake(settings) as writer, Lake.open(settings) as lake:
        con = lake.con
        view = follower.follow(None, fresh=True)
        commits, follows = [], []
        for i in range(5):
            t = time.perf_counter()
            writer.commit(LakeWrite([memory(f"m{i}", f"memory number {i} of the catalog bench")]))
            commits.append(time.perf_counter() - t)
            t = time.perf_counter()
            view = follower.follow(view, fresh=True)
            follows.append(time.perf_counter() - t)
        assert view is not None and view.version == writer.latest_snapshot()
        latest = reads.latest_snapshot(con)
        row = {"snapshots": n,
               "ducklake_ms": _best(lambda: con.execute(f"SELECT id FROM ducklake_current_snapshot('{LAKE}')")
                                    .fetchall()),
               "latest_ms": _best(lambda: reads.latest_snapshot(con)),
               "settled_ms": _best(lambda: reads.settled(con, latest, latest, "the bench")),
               "idle_poll_ms": _best(lambda: follower.follow(view, fresh=True)),
               "commit_ms": round(statistics.median(commits) * 1000, 2),
               "follow_ms": round(statistics.median(follows) * 1000, 2),
               "read_ms": _best(lambda: lake.read())}
    follower.close()
    row["latest_ratio"] = round(row["latest_ms"] / row["ducklake_ms"], 3)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--snapshots", type=int, nargs="+", default=[0, 100_000, 600_000])
    p.add_argument("--postgres", help="a conninfo without dbname, e.g. 'host=127.0.0.1 user=postgres'")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    from pipeline.settings import Settings

    report: dict = {"load_before": os.getloadavg(), "sqlite": [], "postgres": []}
    for n in args.snapshots:
        with tempfile.TemporaryDirectory(prefix="catalog-cost-") as tmp:
            folder = Path(tmp)
            report["sqlite"].append(measure(Settings(data_dir=folder / "s", _env_file=None), n))
            print("sqlite", report["sqlite"][-1], flush=True)
            if not args.postgres:
                continue
            with postgres_lake(args.postgres, folder) as settings:
                report["postgres"].append(measure(settings, n))
            print("postgres", report["postgres"][-1], flush=True)
    report["load_after"] = os.getloadavg()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
