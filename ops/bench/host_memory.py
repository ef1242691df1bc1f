"""Resident memory of two search processes on one lake store, with the host
cache (``pipeline.store.hostcache``: a base's arrays memory-mapped from one
copy per host) and without it (each process reads its own copy), in the
same run:

    python -m ops.bench.host_memory --memories 100000 --work /tmp/hostmem --out /tmp/hostmem/host_memory.json

A lake store of ``--memories`` synthetic memories (``ops.bench.synth.texts``,
embedded by the hash embedder, 384-d) is written through the lake's write
path (``Lake.commit``, batches of 5,000) and given a base at its latest
snapshot (``Follower.build``); kept under ``--work`` for the next run. Then,
for each side, the host cache's folder emptied first, two search processes
run, the second started once the first has answered (with the cache: the
first writes it, the second maps it); each opens the store with
``store.query_memory_limit`` as a worker does, compiles the descent's
kernels, and answers ``--queries`` queries in each of keyword, semantic and
hybrid mode (both legs, through the stages run in process). A third side
starts both at once with the cache (both read the base and race to write;
the loser's freed copy may stay in its heap). When both have answered, their ``VmRSS``
(``/proc/PID/status``) and ``Pss`` (``/proc/PID/smaps_rollup``: a page
mapped by both counts half in each) are read. PSS summed over the two is
the honest figure for the host; RSS counts a shared page in each process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ops.bench import emit

ROOT = Path(__file__).resolve().parents[2]
DIM = 384
BATCH = 5_000


def _settings(work: Path):
    from workers.settings import WorkerSettings

    return WorkerSettings(data_dir=work / "data", embedding_model=f"hash-{DIM}", store={"engine": "lake"},
                          audit_enabled=False, _env_file=None)


def build(settings, n: int, log=print) -> dict:
    """The lake of ``n`` memories and its base (nothing when a previous run left them)."""
    from ops.bench import synth
    from pipeline.embedders import HashEmbedder
    from pipeline.store.database import utcnow
    from pipeline.store.ingest import MemoryRecord
    from pipeline.store.lake import LakeMemory, LakeWrite
    from pipeline.store.lake.follow import Follower, listed

    follower = Follower(settings)
    try:
        lake = follower.lake(DIM)
        assert lake is not None
        held = lake.count()
        if held not in (0, n):
            raise SystemExit(f"{settings.data_dir} holds {held} memories, not {n}: give another --work")
        seconds = {}
        if held == 0:
            t = time.perf_counter()
            docs = synth.texts(n)
            embedder = HashEmbedder(DIM)
            types = ["text", "code", "decision"]
            for start in range(0, n, BATCH):
                now = utcnow()
                records = [MemoryRecord(id=f"s{i:07d}", namespace=f"ns{i % 4}", content=docs[i],
                                        content_type=types[i % 3]) for i in range(start, min(n, start + BATCH))]
                vectors = embedder.embed([r.content for r in records])
                lake.commit(LakeWrite([LakeMemory.from_record(r, vectors[j], now) for j, r in enumerate(records)]))
            seconds["write"] = time.perf_counter() - t
            log(f"wrote {n} memories in {seconds['write']:.0f} s")
        if not listed(lake):
            t = time.perf_counter()
            follower.build(lake.latest_snapshot())
            seconds["base"] = time.perf_counter() - t
            log(f"built the base in {seconds['base']:.0f} s")
        return seconds
    finally:
        follower.close()


class _Pinned:
    """A process's ``Resources`` reading one ``Snapshot`` (``pipeline.stages.stage.Resources``)."""

    def __init__(self, settings, snap):
        from pipeline.embedders import make_embedder

        self._settings, self.snap, self._embedder = settings, snap, make_embedder(settings)

    def settings(self):
        return self._settings

    def embedder(self):
        return self._embedder

    @contextmanager
    def view(self) -> Iterator:
        with self.snap.view() as v:
            yield v


def search_process(settings_json: str, host_cache: bool, queries: int, ready: str, stop: str) -> None:
    """One search process: open the store, answer ``queries`` per mode, report, wait for ``stop``."""
    from ops.bench import synth
    from pipeline.contracts import Batch, Results, make_query
    from pipeline.stages.registry import run_local
    from pipeline.store.lake.follow import Follower
    from pipeline.store.reader import Reader
    from pipeline.store.vector import compile_kernels
    from workers.settings import WorkerSettings

    settings = WorkerSettings.model_validate_json(settings_json)
    compile_kernels()
    t = time.perf_counter()
    reader = Reader(settings.data_dir, memory_limit=settings.query_memory_limit,
                    lake=Follower(settings, memory_limit=settings.query_memory_limit, host_cache=host_cache))
    snap = reader.snapshot()
    assert snap is not None
    snap.index()
    snap.postings()
    opened = time.perf_counter() - t
    res = _Pinned(settings, snap)
    hits = 0
    t = time.perf_counter()
    for mode in ("keyword", "semantic", "hybrid"):
        for text in synth.queries(queries):
            query = make_query(text, {"mode": mode, "top_k": 10}, settings)
            hits += len(Results.from_state(run_local(Batch(states=[{"query": query}]), res).states[0]).results)
    answered = time.perf_counter() - t
    cache = snap._uses.cache if snap._uses is not None else None
    Path(ready).write_text(json.dumps({"open_s": opened, "answer_s": answered, "hits": hits,
                                       "read": cache.read if cache is not None else None,
                                       "wrote": cache.written if cache is not None else None}))
    while not Path(stop).exists():
        time.sleep(0.05)
    reader.close()


def _memory(pid: int) -> dict:
    """VmRSS and the PSS of ``pid``, in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "RssAnon:", "RssFile:")):
            out[line.split(":")[0]] = int(line.split()[1]) / 1024
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Pss:", "Pss_Anon:", "Pss_File:")):
            out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def measure(settings, host_cache: bool, queries: int, scratch: Path, *, together: bool, log=print) -> dict:
    """Two search processes on the store, the second started when the first
    has answered (``together``: both at once, racing to write the cache);
    their memory once both answered."""
    from pipeline.store.lake.follow import cache_dir

    shutil.rmtree(cache_dir(settings), ignore_errors=True)
    stop = scratch / f"stop-{host_cache}"
    stop.unlink(missing_ok=True)
    ready = [scratch / f"ready-{host_cache}-{i}" for i in range(2)]
    for r in ready:
        r.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen] = []

    def wait(files: list[Path]) -> None:
        while not all(r.exists() for r in files):
            if any(p.poll() is not None for p in procs):
                raise SystemExit("a search process ended early")
            time.sleep(0.1)

    try:
        for i, r in enumerate(ready):
            procs.append(subprocess.Popen([sys.executable, "-m", "ops.bench.host_memory", "--search",
                                           settings.model_dump_json(), str(int(host_cache)), str(queries), str(r),
                                           str(stop)], env=env))
            if not together:
                wait(ready[: i + 1])
        wait(ready)
        time.sleep(1.0)
        per = [{**_memory(p.pid), **json.loads(r.read_text())} for p, r in zip(procs, ready, strict=True)]
    finally:
        stop.touch()
        for p in procs:
            p.wait(timeout=120)
    cached = cache_dir(settings)
    side = {"host_cache": host_cache, "together": together, "processes": per,
            "rss_mb": sum(p["VmRSS"] for p in per), "pss_mb": sum(p["Pss"] for p in per),
            "cache_mb": (sum(f.stat().st_size for f in cached.rglob("*") if f.is_file()) / 2**20
                         if cached.is_dir() else 0.0)}
    log(f"host cache {'on' if host_cache else 'off'}{' (started together)' if together else ''}: RSS {side['rss_mb']:.0f} MB, PSS {side['pss_mb']:.0f} MB "
        f"in all (cache folder {side['cache_mb']:.0f} MB)")
    return side


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--search"]:
        search_process(argv[1], argv[2] == "1", int(argv[3]), argv[4], argv[5])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=30, help="queries per mode and process")
    parser.add_argument("--work", type=Path, default=Path("/tmp/dimple-host-memory"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("dimple").setLevel(logging.WARNING)
    settings = _settings(args.work / str(args.memories))
    load = {"start": os.getloadavg()}
    built = build(settings, args.memories)
    off = measure(settings, False, args.queries, args.work, together=False)
    on = measure(settings, True, args.queries, args.work, together=False)
    race = measure(settings, True, args.queries, args.work, together=True)
    load["end"] = os.getloadavg()
    emit({"memories": args.memories, "dim": DIM, "queries_per_mode": args.queries, "built_s": built,
          "loadavg": load, "cpus": os.cpu_count(), "without_cache": off, "with_cache": on,
          "with_cache_started_together": race,
          "pss_ratio": on["pss_mb"] / off["pss_mb"], "rss_ratio": on["rss_mb"] / off["rss_mb"]}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
