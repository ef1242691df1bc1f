"""Disk and memory of one compaction: a synthetic store copied afresh, one
write (forget two base memories, or remember one), then ``compact`` with the
data dir's size sampled every 10 ms and this process's peak RSS.

    python -m ops.bench.synth --n 100000 --out /tmp/scale/s100000
    python -m ops.bench.compact_disk --store /tmp/scale/s100000 --work /tmp/cdisk --write forget
    python -m ops.bench.compact_disk --store /tmp/scale/s100000 --work /tmp/cdisk --write remember --times 3

Bytes are figures at any load; seconds only on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import threading
import time
from pathlib import Path

from ops.bench import emit


def _size(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except FileNotFoundError:  # removed while we looked
            pass
    return total


def run(store: Path, work: Path, kind: str, times: int = 1) -> dict:
    from pipeline.store.compact import compact
    from pipeline.store.writes import parse_records, write
    from workers.settings import WorkerSettings

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(store, work)
    settings = WorkerSettings(data_dir=work, _env_file=None)
    ids = [r[0] for r in __import__("duckdb").connect(str(store / "store.duckdb"), read_only=True)
           .execute("SELECT id FROM memories ORDER BY id LIMIT 2").fetchall()]
    out: dict = {"store": str(store), "write": kind, "load_before": os.getloadavg(), "rounds": []}
    for i in range(times):
        if kind == "forget":
            write(settings, forget=ids if i == 0 else [])
        else:
            write(settings, parse_records([{"id": f"added-{i}", "namespace": "ns0", "content": f"added memory {i}"}],
                                          settings))
        before = _size(work)
        peak = [before]
        done = threading.Event()

        def watch(done: threading.Event = done, peak: list[int] = peak) -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _size(work))
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        t0 = time.perf_counter()
        report = compact(settings, wait=True)
        seconds = time.perf_counter() - t0
        done.set()
        watcher.join()
        row = {"seconds": round(seconds, 1), "forgotten": report.forgotten, "before_mib": round(before / 2**20),
               "peak_mib": round(peak[0] / 2**20), "after_mib": round(_size(work) / 2**20),
               "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
        print(row, flush=True)
        out["rounds"].append(row)
    out["load_after"] = os.getloadavg()
    shutil.rmtree(work, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", type=Path, required=True, help="a store built by ops.bench.synth")
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-compact-disk"))
    p.add_argument("--write", choices=("forget", "remember"), default="forget")
    p.add_argument("--times", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    emit(run(args.store, args.work, args.write, args.times), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
