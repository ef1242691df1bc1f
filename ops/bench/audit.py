"""Queries with the audit trail on against off, measured in blocks.

    python -m ops.bench.audit --rounds 5 --modes keyword hybrid --workers --out F

One round is a block of the same queries per side, the blocks' order
rotating from round to round so drift and warm-up hit every side alike. A
block's clock runs over its queries and then over writing every audit row
they caused (embedded: ``audit.flush``; on workers: until the host's outbox
is empty, the audit worker having written each row and removed its file),
so no row spills into the next block.

A block lasts ``--block-s`` seconds of audit-off queries (3 s unless told:
``--n`` is then how many queries the path's off side answers in that long,
warm, counted once per mode and used by every side of that path). A stream
of queries pays one audit write per writer's linger
(``workers.audit.EMBEDDED_LINGER_S``, 1 s) or per batch of waiting outbox
files, whatever the query rate; a block shorter than the linger would force
a write the stream never makes, and time its wall (tens of milliseconds,
which no query waits for) as if the queries had paid it. Issue 4's blocks (300
queries at 33-45 ms, 2026-11-30) lasted 10-14 s.

Sides, per mode:
- embedded: ``off``; ``on``; ``broken`` (the audit store unwritable: on the
  lake, whose catalog the queries read too, the writes of that side fail in
  this process as an unreachable catalog fails them: every write fails,
  retries and is dead-lettered; drained the same way);
- ``--workers``: ``workers_off`` and ``workers_on``, each through its own
  redis-server and workers started here (an embed worker, a search worker
  with 2 processes; ``workers_on`` an audit worker too), every worker with
  the defaults but ``DIMPLE_AUDIT_ENABLED``.

Reported per side: the block's wall per query, the drain alone, the CPU
spent per query (this process; on workers, with the stack's: Redis and every
worker process), query p50 / p95 inside the blocks; ratios to the off side of
the same path (embedded or workers) per round, then their median. Goal
(issues 4 and 33): audit on within 5% of off per block, embedded and on
workers. Embedded, ``audit.flush`` cuts the writer's linger short, so the
block's wall is what the rows cost. On workers nothing can: each search
process sends its rows a linger (``workers.audit.SEND_LINGER_S``, 1 s) after
the first, so a block's drain waits out up to a second in which nothing runs;
the verdict there reads the CPU the whole stack spent per query (on two
cores, the queries' throughput). The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ops.bench import embedded_demo, emit

# A block's length unless --n is given: several of the embedded writer's 1 s lingers.
BLOCK_S = 3.0
# Each side's baseline: the off side of its path.
_OFF = {"off": "off", "on": "off", "broken": "off", "workers_off": "workers_off", "workers_on": "workers_off"}


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) this process and ``pids`` with their children have used so far."""
    from ops.stack import children

    ticks = os.sysconf("SC_CLK_TCK")
    own = os.times()
    total = own.user + own.system
    seen: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo += children(pid)
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


def _block(queries: list[dict], n: int, mode: str, search, flush, pids: list[int]) -> dict:
    """``n`` queries back to back, then every audit row they caused written, all
    timed; and the CPU this process and ``pids`` (a stack's) used meanwhile."""
    lat = []
    cpu0 = _cpu_s(pids)
    t0 = time.perf_counter()
    for i in range(n):
        q = queries[i % len(queries)]
        t = time.perf_counter()
        search(q["text"], namespace=q.get("namespace"), mode=mode)
        lat.append(time.perf_counter() - t)
    t_queries = time.perf_counter()
    drained = flush(300)
    t1 = time.perf_counter()
    return {"wall_s": t1 - t0, "drain_s": t1 - t_queries, "drained": drained, "lat": lat,
            "cpu_s": _cpu_s(pids) - cpu0}


def _break_lake_audit(broken_dir: Path) -> None:
    """On the lake the rows go to the store's own catalog, which the queries
    read too: the broken side's audit writes (those of settings whose audit dir
    is ``broken_dir``) fail as an unreachable catalog fails them, in this
    process only, and are retried and dead-lettered as usual."""
    from pipeline.audit import lake
    from pipeline.errors import AuditStoreUnavailable

    write, check = lake.write, lake.check_writable

    def failing(real):
        def call(log, *args):
            if log.settings.audit_dir == broken_dir:
                raise AuditStoreUnavailable(f"cannot open {log}: the bench's broken side")
            return real(log, *args)
        return call

    lake.write, lake.check_writable = failing(write), failing(check)


def _calibrate(queries: list[dict], mode: str, block_s: float, settings, search) -> int:
    """How many queries ``settings`` runs in ``block_s`` seconds (untimed otherwise)."""
    import workers

    workers.configure(settings)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < block_s:
        q = queries[n % len(queries)]
        search(q["text"], namespace=q.get("namespace"), mode=mode)
        n += 1
    return n


def _outbox_flush(folder: Path):
    """On workers: wait until the host's outbox holds no file (each row written
    by the audit worker, which then removes its file); False on timeout."""
    from pipeline.audit.letters import outbox_pending

    def flush(timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while outbox_pending(folder):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    return flush


def _worker_stacks(work: Path, base, sides: dict, flushes: dict, pids: dict) -> list:
    """``workers_off`` and ``workers_on``: a redis-server and query workers each
    (with an audit worker for ``on``), on ``base``'s store."""
    import workers
    from ops.stack import Stack
    from workers.app import app

    stacks = []
    for side, on in (("workers_off", False), ("workers_on", True)):
        stack = Stack(work / f"stack-{side}")
        stacks.append(stack)
        stack.start_redis()
        sides[side] = base.replace(broker_url=stack.broker_url, audit_enabled=on)
        workers.configure(sides[side])  # the pings go through it
        stack.start_query_workers(app, side.replace("_", "-"), {
            "DIMPLE_DATA_DIR": str(base.data_dir), "DIMPLE_EMBEDDING_MODEL": base.embedding_model,
            "DIMPLE_AUDIT_ENABLED": str(on).lower()}, audit=on)
        flushes[side] = _outbox_flush(base.audit_outbox_dir)
        pids[side] = [proc.pid for proc in stack.procs.values()]
    return stacks


def main(argv=None) -> int:
    import workers
    from pipeline.audit.letters import dead_letters
    from workers import audit
    from workers.api import search

    p = argparse.ArgumentParser(prog="python -m ops.bench.audit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, help="queries per block (unset: as many as last --block-s off)")
    p.add_argument("--block-s", type=float, default=BLOCK_S, help="a block's length when --n is unset")
    p.add_argument("--modes", nargs="+", default=["hybrid"], choices=["keyword", "semantic", "hybrid"])
    p.add_argument("--rounds", type=int, default=5, help="rounds of one block per side")
    p.add_argument("--warmup", type=int, default=20, help="untimed queries per side first")
    p.add_argument("--workers", action="store_true", help="also through Redis and workers started here")
    p.add_argument("--work", type=Path, default=Path("/tmp/dimple-audit-bench"))
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    base, queries = embedded_demo(args.work)
    broken_dir = args.work / "broken"
    shutil.rmtree(broken_dir, ignore_errors=True)  # dead letters of an earlier run
    broken_dir.mkdir(parents=True)
    _break_lake_audit(broken_dir)
    sides = {
        "off": base.replace(audit_enabled=False),
        "on": base,
        # same store, audit rows aimed at an unwritable place
        "broken": base.replace(audit_dir=broken_dir, audit_max_retries=3, audit_backoff_base_s=0.05),
    }
    flushes = dict.fromkeys(sides, audit.flush)
    pids: dict[str, list[int]] = dict.fromkeys(sides, [])  # embedded: this process alone
    stacks = []
    out: dict = {"rounds": args.rounds, "block_s": None if args.n else args.block_s,
                 "loadavg_before": [round(x, 2) for x in load_before], "modes": {}}
    try:
        if args.workers:
            stacks = _worker_stacks(args.work, base, sides, flushes, pids)
        names = list(sides)
        for mode in args.modes:
            for side in names:  # warm-up: model, store, index, the audit connection
                workers.configure(sides[side])
                _block(queries, args.warmup, mode, search, flushes[side], pids[side])
            # a block's queries, per side: as many as its path's off side runs in --block-s, warm
            n = {side: args.n or _calibrate(queries, mode, args.block_s, sides[side], search)
                 for side in names if side == _OFF[side]}
            n = {side: n[_OFF[side]] for side in names}
            blocks: dict[str, list[dict]] = {side: [] for side in names}
            order_log = []
            for r in range(args.rounds):
                order = names[r % len(names):] + names[: r % len(names)]
                order_log.append(order)
                for side in order:
                    workers.configure(sides[side])  # flushes the previous side's rows first (none left: drained in its block)
                    blocks[side].append(_block(queries, n[side], mode, search, flushes[side], pids[side]))
            out["modes"][mode] = _report(blocks, n, order_log)
    finally:
        workers.configure(base)
        for stack in stacks:
            stack.stop_all()
    out["dead_letters_from_broken_side"] = len(dead_letters(broken_dir / "audit-dead-letters"))
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out["verdict"] = {mode: _verdict(report, args.rounds) for mode, report in out["modes"].items()}
    emit(out, args.out)
    return 0


def _report(blocks: dict[str, list[dict]], n: dict[str, int], order_log: list[list[str]]) -> dict:
    out: dict = {"n_per_block": n, "orders": order_log}
    for side, bs in blocks.items():
        lat = np.concatenate([b["lat"] for b in bs]) * 1000
        out[side] = {
            "block_ms_per_query": [round(b["wall_s"] / n[side] * 1000, 3) for b in bs],
            "block_s": [round(b["wall_s"], 3) for b in bs],
            "drain_ms": [round(b["drain_s"] * 1000, 1) for b in bs],
            "cpu_ms_per_query": [round(b["cpu_s"] / n[side] * 1000, 3) for b in bs],
            "all_drained": all(b["drained"] for b in bs),
            "p50_ms": round(float(np.median(lat)), 3), "p95_ms": round(float(np.percentile(lat, 95)), 3),
        }
    for side in blocks:
        off = _OFF[side]
        if side == off:
            continue
        per_round = [b["wall_s"] / o["wall_s"] for b, o in zip(blocks[side], blocks[off])]
        p50s = [np.median(b["lat"]) / np.median(o["lat"]) for b, o in zip(blocks[side], blocks[off])]
        cpus = [b["cpu_s"] / o["cpu_s"] for b, o in zip(blocks[side], blocks[off])]
        out[f"cpu_ratio_{side}_vs_{off}_median"] = round(float(np.median(cpus)), 4)
        out[f"block_ratio_{side}_vs_{off}"] = [round(x, 4) for x in per_round]
        out[f"block_ratio_{side}_vs_{off}_median"] = round(float(np.median(per_round)), 4)
        out[f"p50_ratio_{side}_vs_{off}_median"] = round(float(np.median(p50s)), 4)
    return out


def _verdict(report: dict, rounds: int) -> str:
    def said(what: str, side: str, off: str) -> str:
        ratio = report[f"{what}_ratio_{side}_vs_{off}_median"]
        return f"{100 * (ratio - 1):+.1f}% ({'met' if ratio <= 1.05 else 'NOT met'})"

    text = (f"audit on, median of {rounds} rounds: embedded, a block's wall (queries + drain) "
            f"{said('block', 'on', 'off')}")
    if "block_ratio_workers_on_vs_workers_off_median" in report:
        text += (f"; on workers, the CPU the stack spent per query {said('cpu', 'workers_on', 'workers_off')}, "
                 f"a block's wall {report['block_ratio_workers_on_vs_workers_off_median']}x (its drain waits out "
                 f"the senders' linger)")
    return (text + f"; goal within 5%. With every audit write failing, query p50 is "
            f"{report['p50_ratio_broken_vs_off_median']}x off's (the retries and dead letters run in the "
            f"background; the broken block's drain waits for them)")


if __name__ == "__main__":
    sys.exit(main())
