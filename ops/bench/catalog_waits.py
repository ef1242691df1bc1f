"""How often a catalog read waits a whole second while other processes write
and exit, on each catalog.

    python -m ops.bench.catalog_waits --writers 40
    python -m ops.bench.catalog_waits --writers 40 --postgres 'host=127.0.0.1 user=postgres'

A fresh lake (a SQLite catalog in a temporary folder; with ``--postgres``, a
PostgreSQL database made for the run and dropped after). One thread of this
process asks ``latest_snapshot()`` without pause, as a search process polls;
meanwhile ``--writers`` processes are started one after another, each opening
the lake, committing one small write and exiting, as ``dimple remember`` from
a shell, a worker's pool process restarting, or a batch job does. Reported per
catalog: the reads, their p50 and p99, the slowest five, and how many took
over 0.5 s (the reads that waited).

Why it matters: DuckDB's SQLite extension sleeps through SQLite's own
``xSleep``, and its SQLite is built without ``usleep``: every sleep SQLite asks
for, a millisecond or a microsecond, lasts a whole second. It sleeps in its
busy handler (``META_BUSY_TIMEOUT``, 5 s by default, reaches it: at 0 half the
waits became "database is locked" errors) and in the WAL read path's own
retries, which no setting reaches (the other half stayed). PostgreSQL is the
baseline: the same run against its catalog.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ops.bench import emit, postgres_lake

_WRITER = """
import sys
from datetime import UTC, datetime
import numpy as np
from pipeline.store.ingest import MemoryRecord
from pipeline.settings import Settings
from pipeline.store.lake.records import LakeMemory, LakeWrite
from pipeline.store.lake.store import Lake
settings = Settings.model_validate_json(sys.argv[1])
record = MemoryRecord(id=sys.argv[2], namespace="bench", content="a write")
now = datetime.now(UTC).replace(tzinfo=None)
with Lake.open(settings, embedding_model="bench", embedding_dim=4) as lake:
    lake.commit(LakeWrite(remember=[LakeMemory.from_record(record, np.ones(4, np.float32), now)]))
"""


def measure(settings, writers: int) -> dict:
    from pipeline.store.lake.store import Lake

    lake = Lake.open(settings, embedding_model="bench", embedding_dim=4)
    try:
        lake.latest_snapshot()
        times: list[float] = []
        errors: list[str] = []
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                try:
                    lake.latest_snapshot()
                except Exception as exc:  # noqa: BLE001 - counted, as a search process would fail its query
                    errors.append(str(exc).splitlines()[0][:120])
                times.append(time.perf_counter() - t)
                time.sleep(0.005)

        poller = threading.Thread(target=poll)
        poller.start()
        began = time.perf_counter()
        try:
            for i in range(writers):
                subprocess.run([sys.executable, "-c", _WRITER, settings.model_dump_json(), f"w{i}"], check=True,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
        finally:
            stop.set()
            poller.join()
        times.sort()
        return {"writers": writers, "seconds": round(time.perf_counter() - began, 1), "reads": len(times),
                "p50_ms": round(statistics.median(times) * 1000, 2),
                "p99_ms": round(times[int(len(times) * 0.99)] * 1000, 2),
                "slowest_ms": [round(t * 1000) for t in times[-5:]],
                "over_half_a_second": sum(t > 0.5 for t in times), "errors": len(errors), "error_kinds": sorted(set(errors))}
    finally:
        lake.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--writers", type=int, default=40)
    p.add_argument("--postgres", help="a conninfo without dbname, e.g. 'host=127.0.0.1 user=postgres'")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    from pipeline.settings import Settings

    report: dict = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="catalog-waits-") as tmp:
        folder = Path(tmp)
        report["sqlite"] = measure(Settings(data_dir=folder / "s", _env_file=None), args.writers)
        print("sqlite", report["sqlite"], flush=True)
        if args.postgres:
            with postgres_lake(args.postgres, folder) as settings:
                report["postgres"] = measure(settings, args.writers)
            print("postgres", report["postgres"], flush=True)
    report["load_after"] = os.getloadavg()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
