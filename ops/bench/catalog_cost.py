"""What a lake read's questions to a SQLite catalog cost as its snapshots grow.

    python -m ops.bench.catalog_cost --snapshots 10000 100000 600000

A fresh lake (SQLite catalog in a temporary folder) is given N extra rows in
DuckLake's ``ducklake_snapshot`` and ``ducklake_snapshot_changes`` tables
(ids below the lake's own, so DuckLake's view of the lake is unchanged: a
busy week at ``store.retain`` keeps ~600,000, most of them audit commits).
Timed, best of 5 each, in one process:

- ``scanner``: the baseline, ``read.settled``'s two questions as it asked
  them before, through DuckDB's SQLite scanner (it pushes neither a filter nor
  an aggregate down: the tables are read whole), each its own transaction;
- ``settled``: ``read.settled`` now (``catalog.ask``: ``sqlite_query`` by
  key, both questions in one transaction);
- ``latest``: ``latest_snapshot()``, one statement: what DuckLake itself
  costs each transaction's first statement on a SQLite catalog.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from ops.bench import emit


def _best(step, rounds: int = 5) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return round(min(times) * 1000, 2)


def measure(n: int) -> dict:
    from pipeline.settings import Settings
    from pipeline.store.lake import Lake
    from pipeline.store.lake import read as reads
    from pipeline.store.lake.catalog import META

    folder = Path(tempfile.mkdtemp(prefix="catalog-cost-"))
    settings = Settings(data_dir=folder, embedding_model="hash-64", _env_file=None)
    Lake.open(settings, embedding_model="hash-64", embedding_dim=64).close()
    db = sqlite3.connect(folder / "lake.sqlite")
    db.executemany("INSERT INTO ducklake_snapshot VALUES (?, '2026-01-01 00:00:00+00', 0, 0, 0)",
                   ((-i,) for i in range(1, n + 1)))
    db.executemany("INSERT INTO ducklake_snapshot_changes VALUES (?, 'inlined_insert:1', NULL, 'audit', NULL)",
                   ((-i,) for i in range(1, n + 1)))
    db.commit()
    db.close()
    with Lake.open(settings) as lake:
        con = lake.con
        latest = reads.latest_snapshot(con)

        def scanner() -> None:
            con.execute(f"SELECT min(snapshot_id) FROM {META}.ducklake_snapshot").fetchall()
            con.execute(f"SELECT snapshot_id, changes_made FROM {META}.ducklake_snapshot_changes "
                        "WHERE snapshot_id > ?", [latest]).fetchall()

        row = {"snapshots": n, "scanner_ms": _best(scanner),
               "settled_ms": _best(lambda: reads.settled(con, latest, latest, "the bench")),
               "latest_ms": _best(lambda: reads.latest_snapshot(con))}
    row["ratio"] = round(row["settled_ms"] / row["scanner_ms"], 3)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--snapshots", type=int, nargs="+", default=[10_000, 100_000, 600_000])
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    report: dict = {"load_before": os.getloadavg(), "rows": []}
    for n in args.snapshots:
        report["rows"].append(measure(n))
        print(report["rows"][-1], flush=True)
    report["load_after"] = os.getloadavg()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
