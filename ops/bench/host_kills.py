"""Issue 34's goal on three hosts: "PostgreSQL catalog, three hosts: 0
acknowledged writes lost over 40 kills; identical results on every host", and
where a write's time goes from an agent's send to its acknowledgement.

    python -m ops.bench.host_kills --kills 40 --out docs/bench/results/host_kills_40.json

Three hosts as ``tests/slow/test_three_hosts.py`` starts them
(``tests.hosts.three_hosts``: network namespaces on a bridge, one
redis-server, one PostgreSQL catalog, a shared data path; on each host its own
data dir and a worker for ``embed,search,ingest`` with two processes, the real
model, every setting the default but the store's, audit off). It needs root,
``ip``, ``socat``, ``redis-server`` and a PostgreSQL server
(``tests.lakes.find_postgres``), and says which is missing.

First, ``--alone`` one-memory writes from host 1, one at a time: sent ->
acknowledged p50, and its parts: the ingest worker's embedding and store
write (the write's own ``seconds``) and the rest (broker, queue, the task's
dispatch, the result's way back).

Then the kills. Each round, the agents on hosts 1 and 2 write ``--burst``
one-memory writes each through the broker (any host's ``ingest`` worker
takes each), and one host's worker (hosts 1, 2, 3 in turn) is SIGKILLed with
its pool as soon as its log shows a write received and not finished; the
write it held goes back on the queue when its lease lapses (the default
``DIMPLE_VISIBILITY_TIMEOUT_S``) and another host runs it. The worker is
started again before the next round. A round in which the victim took no
write is run again and not counted. After each round, read from a process on
no host: every acknowledged write is in the lake, and none twice. At the end
the same queries (keyword, semantic, hybrid) answer the same ids, ranks and
scores on the three hosts.

No baseline store: the segment store cannot be shared by hosts. Its one-host
kills are ``ops.bench.lake_kills``. Exit status 1 when an acknowledged write
was lost, a memory is present twice, or the hosts answer differently.
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


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 1) if xs else float("nan")


def alone(h, n: int) -> dict:
    """``n`` one-memory writes from host 1, one at a time: sent -> acknowledged and its parts (p50, ms)."""
    from tests.hosts import NAMESPACE

    took, embed, store, rest = [], [], [], []
    for k in range(n):
        done = h.writers[1].ask("remember", records=[{"id": f"alone-{k}", "namespace": NAMESPACE,
                                                      "content": f"a write alone, number {k}"}])
        total = done["acked"] - done["sent"]
        own = done["seconds"]
        took.append(total)
        embed.append(own.get("embed", 0.0))
        store.append(own["total"] - own.get("embed", 0.0))
        rest.append(total - own["total"])
    return {"writes": n, "sent_to_acked_ms": _ms(took), "embed_ms": _ms(embed), "store_write_ms": _ms(store),
            "broker_and_dispatch_ms": _ms(rest), "max_sent_to_acked_ms": round(max(took) * 1000, 1)}


def run(kills: int, burst: int, n_alone: int, scratch: Path, log=print) -> dict:
    """Three hosts up under ``scratch``, then ``measure``."""
    from tests.hosts import missing, three_hosts

    why = missing()
    if why:
        raise SystemExit(f"three hosts cannot run here: {why}")
    load_before = _load()
    with three_hosts(scratch, log=log) as h:
        return measure(h, kills, burst, n_alone, log) | {"load_before": load_before}


def measure(h, kills: int, burst: int, n_alone: int, log=print) -> dict:
    """The writes alone, then ``kills`` rounds that caught a worker holding a write, on hosts ``h``."""
    from tests.hosts import HOSTS, NAMESPACE, QUERIES, kill_round

    load_before = _load()
    t0 = time.perf_counter()
    quiet = alone(h, n_alone)
    log(f"alone: {quiet}")
    acknowledged: dict[str, dict] = {}
    failed: dict[str, dict] = {}
    rounds, lost, twice, not_holding, restarts = 0, set(), set(), 0, []
    r = 0
    while rounds < kills:
        victim = HOSTS[r % len(HOSTS)]
        got = kill_round(h, victim, f"k{r}h", burst)
        r += 1
        acknowledged.update(got["acked"])
        failed.update(got["failed"])
        if got["killed"]:
            t1 = time.perf_counter()
            h.start_worker(victim)
            restarts.append(time.perf_counter() - t1)
        if not got["held"]:
            not_holding += 1
            log(f"round {r}: host {victim}'s worker held no write {'at the kill' if got['killed'] else ''}: "
                "not counted")
            if r > 3 * kills:
                raise SystemExit(f"only {rounds} of {r} rounds caught a worker holding a write")
            continue
        rounds += 1
        ids, latest = h.lake_ids()
        lost |= set(acknowledged) - set(ids)
        twice |= {i for i, c in ids.items() if c > 1}
        log(f"kill {rounds}: host {victim} held {len(got['held'])} write(s); {len(got['acked'])} acknowledged, "
            f"{len(got['failed'])} failed, in {got['seconds']:.1f} s; lost so far {len(lost)}, twice {len(twice)}; "
            f"snapshot {latest}; load {_load()}")
    _, latest = h.lake_ids()
    answers = {i: h.probes[i].ask("queries", queries=QUERIES, min_version=latest, namespace=NAMESPACE)["answers"]
               for i in HOSTS}
    differ = [q for q, a1, a2, a3 in zip(QUERIES, answers[1], answers[2], answers[3])
              if not (a1["hits"] == a2["hits"] == a3["hits"]) or not a1["hits"]]
    return {"kills": rounds, "rounds": r, "rounds_not_holding": not_holding, "acknowledged": len(acknowledged),
            "lost": len(lost), "lost_ids": sorted(lost)[:20], "present_twice": len(twice),
            "failed": len(failed), "failed_examples": [v["failed"] for v in list(failed.values())[:3]],
            "queries": len(QUERIES), "queries_differing": len(differ), "latest_snapshot": latest,
            "restart_p50_s": round(statistics.median(restarts), 1) if restarts else None,
            "alone": quiet, "seconds": round(time.perf_counter() - t0, 1),
            "load_before": load_before, "load_after": _load()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=40, help="kills that caught a worker holding a write")
    parser.add_argument("--burst", type=int, default=6, help="one-memory writes from each of hosts 1 and 2 a round")
    parser.add_argument("--alone", type=int, default=20, help="writes one at a time before the kills")
    parser.add_argument("--work", type=Path, help="keep the hosts' files here (default: a temporary folder)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
        row = run(args.kills, args.burst, args.alone, Path(tempfile.mkdtemp(dir=args.work)))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            row = run(args.kills, args.burst, args.alone, Path(tmp))
    print(json.dumps(row, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(row, indent=1))
    return 1 if row["lost"] or row["present_twice"] or row["queries_differing"] else 0


if __name__ == "__main__":
    sys.exit(main())
