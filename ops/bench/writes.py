"""The write path against the whole-store path, in the same run, at several
store sizes (synthetic stores, ``ops.bench.synth``, migrated into a lake once
per size: ``dimple migrate``, SQLite catalog in the data dir):

    python -m ops.bench.writes --sizes 10000 100000 --work /tmp/wbench --out /tmp/wbench/writes.json
    python -m ops.bench.writes --sizes 1000000 --no-pending --baseline-parts one --work /tmp/wbench

(a) one memory remembered, and the time until a query in another process
    (a warm reader polling keyword search, following the lake at
    ``store.poll_ms`` as a search process does) returns it;
(b) a 1,000-memory batch;
(c) query p50 (the keyword and vector legs alone, and a hybrid query end to
    end through the embedded canvas) with 10 and 100 one-memory writes merged
    over the base against the same memories compacted, the three stores
    alternated round by round in one process;
(e) compaction time, and hybrid queries sent back to back meanwhile
    (count, failures, p50/p99).

The whole-store path is the same code with every write building a new base
of the whole store (``compact_delta_memories=1``): what every write cost
before writes became deltas. Embeddings come from the hash embedder (384-d)
on both sides, so embedding is not timed (the real model adds ~17 ms per
memory, BENCHMARKS.md "Query embedder").
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ops.bench import emit

ROOT = Path(__file__).resolve().parents[2]

_POLLER = """
import sys, time
from pipeline.contracts import Scope
from pipeline.settings import Settings
from pipeline.store import fulltext
from pipeline.store.lake.follow import reader_for
s = Settings.model_validate_json(sys.argv[1])
token = sys.argv[2]
reader = reader_for(s)
snap = reader.snapshot(); snap.index(); snap.postings()
print("ready", flush=True)
while True:
    snap = reader.snapshot()
    hits, _ = fulltext.search_until(snap.store.con, token, Scope(), 5, s.fulltext, None, snap.overlay,
                                    snap.postings())
    if hits:
        print(time.time(), flush=True)
        break
    time.sleep(0.005)
"""


def bench_settings(data_dir: Path, direct: bool):
    from workers.settings import WorkerSettings  # the settings workers.configure takes

    extra = {"compact_delta_memories": 1} if direct else {}
    return WorkerSettings(data_dir=data_dir, embedding_model="hash-384", _env_file=None, **extra)


def synthetic_lake(work: Path, n: int) -> Path:
    """A synthetic store of ``n`` memories (one base file, as ``ops.bench.synth``
    writes it) migrated into a lake (``dimple migrate``: catalog and data files
    in the data dir, a base built at its snapshot), once per size."""
    from ops.bench.synth import build_store
    from pipeline.store.lake.migrate import Marker, migrate

    synthetic = work / f"store-{n}"
    folder = work / f"lake-store-{n}"
    if Marker.read(folder) is None:
        if not (synthetic / "store.duckdb").exists():
            synthetic.mkdir(parents=True, exist_ok=True)
            build_store(synthetic / "store.duckdb", n, bench_settings(synthetic, False), embedding_model="hash-384",
                        log=lambda *a: None)
        _fresh(synthetic, folder)
        t = time.perf_counter()
        migrate(bench_settings(folder, False))
        print(f"migrated {synthetic.name} into a lake in {time.perf_counter() - t:.1f} s", flush=True)
    return folder


# The catalog records the lake's data path whole: a copy of a lake folder is
# pointed at its own (in a child process: a second SQLite copy beside DuckDB's
# in one process is what ``erase._VACUUM_SCRIPT`` avoids too)
_REPOINT = ("import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
            "db.execute(\"UPDATE ducklake_metadata SET value = ? WHERE key = 'data_path'\", [sys.argv[2]]); "
            "db.commit()")


def _fresh_lake(template: Path, scratch: Path) -> Path:
    _fresh(template, scratch)
    subprocess.run([sys.executable, "-c", _REPOINT, str(scratch / "lake.sqlite"), f"{scratch / 'lake'}/"], check=True)
    return scratch


def _fresh(template: Path, scratch: Path) -> Path:
    if scratch.exists():
        shutil.rmtree(scratch)
    shutil.copytree(template, scratch)
    return scratch


def _records(prefix: str, n: int, token: str = "") -> list[dict]:
    return [{"id": f"{prefix}-{i}", "namespace": f"ns{i % 4}",
             "content": f"benchmark memory {prefix} {i} deploy window {token}".strip()} for i in range(n)]


def _write(settings, records, reader=None):
    """One write, timed; ``reader`` is the writer's view kept between writes, as
    the ingest worker keeps its own (``workers.resources.current().reader``)."""
    from pipeline.embedders import HashEmbedder
    from pipeline.store.writes import parse_records, write

    t = time.perf_counter()
    write(settings, parse_records(records, settings), embedder=HashEmbedder(384), reader=reader)
    return time.perf_counter() - t


def one_memory(template: Path, scratch: Path, direct: bool, repeat: int = 1) -> dict:
    """``repeat`` one-memory writes in a row on one fresh copy, each seen by a
    poller started (and warm) before it: the p50 of each figure, and each."""
    from pipeline.store.lake.follow import reader_for

    settings = bench_settings(_fresh_lake(template, scratch), direct)
    reader = reader_for(settings)
    # a first write warms the writer's view; the memories timed are the writes after it on every side
    _write(settings, _records("warm", 1), reader)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    acks, after, visible = [], [], []
    for k in range(repeat):
        token = f"zqvis{k}x{int(time.time() * 1000) % 10**8}"
        poller = subprocess.Popen([sys.executable, "-c", _POLLER, settings.model_dump_json(), token],
                                  stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        assert poller.stdout is not None and poller.stdout.readline().strip() == "ready"
        start = time.time()
        acks.append(_write(settings, _records(f"one{k}", 1, token), reader))
        acked = time.time()
        seen = float(poller.stdout.readline())
        poller.wait(30)
        after.append(max(seen - acked, 0.0))
        visible.append(seen - start)
    reader.close()
    return {"writes": repeat, "ack_s": round(statistics.median(acks), 4),
            "visible_after_ack_s": round(statistics.median(after), 4),
            "visible_s": round(statistics.median(visible), 4), "visible_each_s": [round(v, 4) for v in visible]}


def batch(template: Path, scratch: Path, direct: bool, size: int = 1000) -> float:
    from pipeline.store.lake.follow import reader_for

    settings = bench_settings(_fresh_lake(template, scratch), direct)
    reader = reader_for(settings)
    _write(settings, _records("warm", 1), reader)
    took = _write(settings, _records("batch", size), reader)
    reader.close()
    return round(took, 3)


def interleaved_p50(sides: dict, queries: list[str], vectors: np.ndarray, rounds: int = 5,
                    baseline: str = "compacted") -> dict:
    """Query p50 of each side (settings of a data dir), the sides alternated
    round by round in this process: the keyword and vector legs alone (one
    reader per side, kept open), and a hybrid query end to end through the
    embedded canvas (audit off), warmed before each round's timing. Ratios
    are against the side ``baseline``."""
    import workers
    from pipeline.contracts import Scope
    from pipeline.store import fulltext
    from pipeline.store.lake.follow import reader_for
    from pipeline.store.vector import delta_hits, descend
    from workers import resources
    from workers.api import search

    readers = {name: reader_for(s) for name, s in sides.items()}
    times: dict = {name: {"fts": [], "vector": [], "hybrid": []} for name in sides}
    for _ in range(rounds):
        for name, settings in sides.items():
            snap = readers[name].snapshot()
            index, overlay, con, tree = snap.index(), snap.overlay, snap.store.con, settings.tree
            for q, v in zip(queries, vectors):
                t = time.perf_counter()
                fulltext.search_until(con, q, Scope(), 10, settings.fulltext, None, overlay, snap.postings())
                times[name]["fts"].append(time.perf_counter() - t)
                t = time.perf_counter()
                hits, _ = descend(index, v, index.start_topics(Scope()), beam_width=tree.beam_width,
                                  max_depth=tree.max_depth, top_k=10, exclude=overlay.dead_rows(index))
                if not overlay.empty:
                    sorted(hits + delta_hits(overlay, v, Scope(), 10), key=lambda h: (-h[1], h[0]))
                times[name]["vector"].append(time.perf_counter() - t)
            workers.configure(settings.replace(audit_enabled=False))
            for q in queries[:10]:
                search(q)
            for q in queries:
                t = time.perf_counter()
                search(q)
                times[name]["hybrid"].append(time.perf_counter() - t)
            resources.current().close_store()
    for r in readers.values():
        r.close()
    out = {name: {f"{leg}_p50_ms": round(statistics.median(v) * 1000, 3) for leg, v in legs.items()}
           for name, legs in times.items()}
    base = out[baseline]
    for name, row in out.items():
        if name != baseline:
            for leg in ("fts", "vector", "hybrid"):
                row[f"{leg}_ratio"] = round(row[f"{leg}_p50_ms"] / base[f"{leg}_p50_ms"], 3)
    return out


def queries_during(settings, queries: list[str], task) -> dict:
    """Hybrid queries (embedded canvas) sent back to back while ``task`` runs in this process."""
    import threading

    import workers
    from workers.api import search

    workers.configure(settings.replace(audit_enabled=False))
    search(queries[0])
    stop, lat, failed = threading.Event(), [], []

    def loop() -> None:
        i = 0
        while not stop.is_set():
            t = time.perf_counter()
            try:
                search(queries[i % len(queries)])
                lat.append(time.perf_counter() - t)
            except Exception as exc:  # noqa: BLE001 - every failure counts
                failed.append(repr(exc))
            i += 1

    thread = threading.Thread(target=loop)
    thread.start()
    t = time.perf_counter()
    task()
    took = time.perf_counter() - t
    stop.set()
    thread.join(120)
    lat.sort()
    return {"task_s": round(took, 3), "queries": len(lat), "failed": len(failed),
            "p50_ms": round(lat[len(lat) // 2] * 1000, 2) if lat else None,
            "p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000, 2) if lat else None}


def pending_deltas(template: Path, scratch: Path) -> dict:
    """(c) and (e): the same memories as 10 and 100 one-memory writes over the
    base, and compacted; query p50s interleaved; then the 100 compacted while
    queries run."""
    from ops.bench.synth import queries as synth_queries
    from pipeline.embedders import HashEmbedder
    from pipeline.store.maintenance import compact
    from workers import resources

    settings = bench_settings(_fresh_lake(template, scratch), False).replace(compact_max_deltas=10_000)
    qs = synth_queries(100)
    vecs = HashEmbedder(384).embed(qs)
    _write(settings, _records("warm", 1))
    compact(settings, wait=True)
    copies = {}
    for written in range(100):
        _write(settings, _records(f"d{written}", 1))
        if written + 1 in (10, 100):
            resources.current().close_store()  # nothing of this process holds the lake while it is copied
            copies[f"{written + 1}_deltas"] = settings.replace(
                data_dir=_fresh_lake(scratch, scratch.with_name(scratch.name + f"-{written + 1}")))
    compacted = copies["100_deltas"].replace(
        data_dir=_fresh_lake(copies["100_deltas"].data_dir, scratch.with_name(scratch.name + "-compacted")))
    compact(compacted, wait=True)
    out = interleaved_p50({"compacted": compacted, **copies}, qs, vecs)
    out["during_compaction"] = queries_during(settings, qs, lambda: compact(settings, wait=True))
    out["compaction_s"] = out["during_compaction"].pop("task_s")
    for s in (compacted, *copies.values()):
        shutil.rmtree(s.data_dir, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-writes-bench"))
    p.add_argument("--out", type=Path)
    p.add_argument("--only-pending", action="store_true", help="run (c) and (e) only")
    p.add_argument("--no-pending", action="store_true", help="skip (c) and (e) (at 1M: minutes of compaction)")
    p.add_argument("--repeat", type=int, default=1, help="one-memory writes timed in a row (their p50 reported)")
    p.add_argument("--baseline-parts", default="one,batch",
                   help="which of one,batch the whole-store path runs (each costs a whole-store write)")
    args = p.parse_args(argv)
    report: dict = {"load_before": os.getloadavg()}
    for n in args.sizes:
        template = synthetic_lake(args.work, n)
        scratch = args.work / f"scratch-{n}"
        row: dict = {}
        parts = {"lake": {"one", "batch"}, "whole_store": set(args.baseline_parts.split(","))}
        for side, direct in () if args.only_pending else (("lake", False), ("whole_store", True)):
            row[side] = {}
            if "one" in parts[side]:
                row[side]["one_memory"] = one_memory(template, scratch, direct, args.repeat)
            if "batch" in parts[side]:
                row[side]["batch_1000_s"] = batch(template, scratch, direct)
            print(n, side, row[side], flush=True)
        if row.get("whole_store", {}).get("one_memory"):
            row["one_memory_visible_ratio"] = round(
                row["lake"]["one_memory"]["visible_s"] / row["whole_store"]["one_memory"]["visible_s"], 4)
        if row.get("whole_store", {}).get("batch_1000_s"):
            row["batch_ratio"] = round(row["lake"]["batch_1000_s"] / row["whole_store"]["batch_1000_s"], 4)
        if not args.no_pending:
            row["pending_deltas"] = pending_deltas(template, scratch)
            print(n, "pending", row["pending_deltas"], flush=True)
        shutil.rmtree(scratch, ignore_errors=True)
        report[str(n)] = row
    report["load_after"] = os.getloadavg()
    emit(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
