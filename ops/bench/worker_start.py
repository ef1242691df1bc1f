"""How soon a worker takes work, what its pool processes hold, and what an
agent's first writes cost through it.

    python -m ops.bench.worker_start --queues ingest --concurrency 2 --rounds 3

Each round starts a real worker (``ops.stack``: a redis-server on loopback,
``celery -A workers.app worker``, the default settings and the real model)
on an empty data dir and times, from the process start:

- ``ready``: its ready line (``workers/warmup.py``: every pool process loaded
  what its queues need);
- ``rss``: the pool processes' resident memory at that line (summed);
- for ``ingest``: one memory remembered through the broker (what an agent's
  turn costs), then a write of ``--batch`` new memories (more than one
  embedding batch: ``writes._embedder_for`` picks the bulk embedder).

To compare two versions, run it at each (a ``git worktree`` of the other)
one after the other on a quiet machine: the figures are absolute.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _pool_rss_mib(main_pid: int) -> float:
    """Resident memory of ``main_pid``'s child processes (its pool), MiB."""
    from ops.stack import children

    total = 0
    for pid in children(main_pid):
        status = Path(f"/proc/{pid}/status").read_text()
        total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return total / 1024


def one_round(queues: str, concurrency: int, batch: int) -> dict[str, float]:
    import workers
    from ops.stack import Stack
    from workers.settings import WorkerSettings

    root = Path(tempfile.mkdtemp(prefix="dimple-worker-start-"))
    stack = Stack(root / "run")
    stack.start_redis()
    try:
        data = root / "data"
        t0 = time.perf_counter()
        stack.start_worker("bench", queues, concurrency=concurrency, env={"DIMPLE_DATA_DIR": str(data)})
        stack.wait_for_ready("bench", timeout=600)
        out = {"ready_s": time.perf_counter() - t0, "pool_rss_mib": _pool_rss_mib(stack.procs["bench"].pid)}
        if "ingest" in queues.split(","):
            from workers.api import remember

            workers.configure(WorkerSettings(data_dir=data, broker_url=stack.broker_url, _env_file=None))
            t1 = time.perf_counter()
            remember({"id": "first", "namespace": "bench", "content": "the agent's first memory of the session"})
            out["first_write_ms"] = (time.perf_counter() - t1) * 1000
            t1 = time.perf_counter()
            remember({"id": "second", "namespace": "bench", "content": "and its second, a turn later"})
            out["second_write_ms"] = (time.perf_counter() - t1) * 1000
            records = [{"id": f"b{i}", "namespace": "bench", "content": f"bulk memory {i} about topic {i % 37}"}
                       for i in range(batch)]
            t1 = time.perf_counter()
            remember(records)
            out["batch_write_s"] = time.perf_counter() - t1
            out["pool_rss_after_mib"] = _pool_rss_mib(stack.procs["bench"].pid)
        return out
    finally:
        stack.stop_all()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queues", default="ingest")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=500, help="memories in the bulk write (ingest)")
    ap.add_argument("--out", type=Path, help="write the rounds and medians here (JSON)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rounds = []
    for r in range(args.rounds):
        rounds.append(one_round(args.queues, args.concurrency, args.batch))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:,.1f}" for k, v in rounds[-1].items()), flush=True)
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print("median: " + ", ".join(f"{k} {v:,.1f}" for k, v in medians.items()))
    print(f"load average {os.getloadavg()[0]:.2f}; python {sys.version.split()[0]}")
    if args.out:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rounds": rounds,
                                        "median": medians, "load": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
