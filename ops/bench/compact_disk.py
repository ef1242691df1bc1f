"""Disk and memory of one compaction: a synthetic store migrated afresh into a
lake in the work folder (``dimple migrate``), one write (forget two base
memories, or remember one), then ``compact`` with the data dir's size (lake
files, catalog, bases) sampled every 10 ms and this process's peak RSS. A
forget is erased by the first compaction once it is due
(``store.erase_within``, here its least, a minute: the run waits for it), so
that compaction rewrites the files that held it.

    python -m ops.bench.compact_disk --n 100000 --work /tmp/cdisk --write forget
    python -m ops.bench.compact_disk --n 100000 --work /tmp/cdisk --write remember --times 3

The synthetic store (``ops.bench.synth``, hash-384 vectors) is built once
into ``--synth`` and reused.

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


def synthetic(n: int, folder: Path) -> Path:
    """A synthetic store of ``n`` memories in ``folder`` (built once)."""
    from ops.bench.synth import build_store
    from workers.settings import WorkerSettings

    if not (folder / "store.duckdb").exists():
        folder.mkdir(parents=True, exist_ok=True)
        build_store(folder / "store.duckdb", n, WorkerSettings(data_dir=folder, _env_file=None,
                                                               embedding_model="hash-384"),
                    embedding_model="hash-384", log=lambda *a: None)
    return folder


def run(store: Path, work: Path, kind: str, times: int = 1) -> dict:
    from pipeline.store.lake.follow import reader_for
    from pipeline.store.lake.migrate import migrate
    from pipeline.store.maintenance import compact
    from pipeline.store.writes import parse_records, write
    from workers.settings import WorkerSettings

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shutil.copyfile(store / "store.duckdb", work / "store.duckdb")
    settings = WorkerSettings(data_dir=work, _env_file=None, embedding_model="hash-384",
                              store={"erase_within": "PT1M"})
    ids = [r[0] for r in __import__("duckdb").connect(str(store / "store.duckdb"), read_only=True)
           .execute("SELECT id FROM memories ORDER BY id LIMIT 2").fetchall()]
    t0 = time.perf_counter()
    migrate(settings)
    out: dict = {"store": str(store), "write": kind, "load_before": os.getloadavg(),
                 "migrate_s": round(time.perf_counter() - t0, 1), "rounds": []}
    for i in range(times):
        if kind == "forget":
            write(settings, forget=ids if i == 0 else [])
            reader = reader_for(settings)
            try:
                assert reader.lake is not None
                deadline = time.monotonic() + 120
                while not reader.lake.erase_due(fresh=True) and time.monotonic() < deadline:  # type: ignore[attr-defined]
                    time.sleep(1)
            finally:
                reader.close()
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
    p.add_argument("--n", type=int, default=100_000, help="memories in the synthetic store")
    p.add_argument("--synth", type=Path, default=Path("/tmp/dimple-synth"), help="where synthetic stores are kept")
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-compact-disk"))
    p.add_argument("--write", choices=("forget", "remember"), default="forget")
    p.add_argument("--times", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    emit(run(synthetic(args.n, args.synth / f"s{args.n}"), args.work, args.write, args.times), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
