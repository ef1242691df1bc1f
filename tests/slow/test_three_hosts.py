"""Three hosts, tested as hosts (issue 34 item 9): three network namespaces
on a bridge the test creates (``tests/hosts.py``), one redis-server and one
PostgreSQL catalog reached over that network, one shared data path, and on
each host its own data dir (its cache: bases, extension links), its own Celery
worker (``embed``, ``search`` and ``ingest``, two processes) and its own
processes that write (an agent through the broker) and search (in-process,
against that host's data dir). Every setting is the default but the store's
(``DIMPLE_STORE__ENGINE=lake``, ``__CATALOG=postgres:...``, ``__DATA_PATH``)
and the audit trail, which is off: the audit on several hosts is item 6 of
the issue (an outbox per host, ``retrieval_log`` in the lake), not built yet.

Checked: writes from two hosts at once all present once; every acknowledged
write answered by a search on every host within a bound (the times are
printed) and at once with ``min_version``; one host's worker SIGKILLed
during writes from two hosts loses nothing acknowledged (the message it held
is delivered again, within the visibility timeout, to another host's worker)
and the store opens; the same queries answer the same on every host (ids,
ranks, scores) and through the broker.
"""

from __future__ import annotations

import os
import re
import signal
import statistics
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.hosts import ROOT, Agent, Forward, Network, conninfo_parts, skip_unless_hosts
from tests.lakes import find_postgres

# one worker of xdist runs them all, in order, on one set of hosts (``--dist loadgroup``)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("three-hosts")]

NAMESPACE = "hosts"
HOSTS = (1, 2, 3)
SEED = 150  # memories written first, in one batch (it builds the first base)
WORDS = ("deploy window rollback canary shard replica backup restore latency budget queue worker broker "
         "snapshot catalog parquet index vector postings tree cluster memory agent session token cache "
         "schema migration audit trail forget remember search hybrid keyword semantic fusion rank score "
         "network bridge namespace postgres redis celery ingest compaction").split()
QUERIES = [{"text": text, "mode": mode} for text in ("rollback of the canary deploy", "replica backup restore",
                                                      "vector index tree cluster", "audit trail of a session")
           for mode in ("keyword", "semantic", "hybrid")]


@dataclass
class Hosts:
    net: Network
    tmp: Path
    catalog: str
    shared: Path
    stacks: dict = field(default_factory=dict)  # host -> ops.stack.Stack (its worker)
    writers: dict = field(default_factory=dict)  # host -> Agent (writes through the broker)
    probes: dict = field(default_factory=dict)  # host -> Agent (searches on that host)
    broker_url: str = ""
    broker_password: str = ""

    def env(self, i: int, broker: bool) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DIMPLE_")}
        env.update({
            "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "DIMPLE_DATA_DIR": str(self.tmp / f"host{i}" / "data"),
            "DIMPLE_STORE__ENGINE": "lake", "DIMPLE_STORE__CATALOG": self.catalog,
            "DIMPLE_STORE__DATA_PATH": str(self.shared), "DIMPLE_AUDIT_ENABLED": "false",
        })
        if broker:
            env.update(DIMPLE_BROKER_URL=self.broker_url, DIMPLE_BROKER_PASSWORD=self.broker_password)
        return env

    def worker(self, i: int) -> str:
        return f"h{i}-worker"

    def start_worker(self, i: int, wait: bool = True) -> None:
        stack = self.stacks[i]
        stack.start_worker(self.worker(i), "embed,search,ingest", concurrency=2, env=self.env(i, broker=True))
        if wait:
            stack.wait_for_ready(self.worker(i))

    def kill_worker(self, i: int) -> None:
        proc = self.stacks[i].procs.pop(self.worker(i))
        os.killpg(proc.pid, signal.SIGKILL)  # the worker's main process and its pool
        proc.wait(30)

    def log(self, i: int) -> str:
        stack = self.stacks[i]
        with open(stack.run_dir / f"{self.worker(i)}.log", "rb") as f:
            f.seek(stack.log_start.get(self.worker(i), 0))
            return f.read().decode(errors="replace")

    def lake_ids(self) -> tuple[Counter, int]:
        """Every live memory id in the lake (how often each appears) and its latest snapshot, read from here."""
        from pipeline.store.lake import Lake
        from workers.settings import WorkerSettings

        with Lake.open(WorkerSettings(**_store(self))) as lake:
            return Counter(m.id for m in lake.read()), lake.latest_snapshot()


def _store(h: Hosts) -> dict:
    from pipeline.settings import StoreSettings

    return {"data_dir": h.tmp / "client", "store": StoreSettings(engine="lake", catalog=h.catalog, data_path=h.shared),
            "audit_enabled": False, "_env_file": None}


def _text(rng, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    skip_unless_hosts()
    import random

    from ops.stack import Stack

    tmp = tmp_path_factory.mktemp("hosts")
    pg = find_postgres(tmp)  # skips, naming what to install, when there is none
    t0 = time.perf_counter()
    net = Network(len(HOSTS))
    cleanup: list = []
    net.open()
    try:
        parts = conninfo_parts(pg.base)
        forward = Forward(net.address, parts.get("host", "127.0.0.1"), int(parts.get("port", "5432")),
                          tmp / "socat.log")
        cleanup.append(forward.close)
        database = pg.create_database()
        cleanup.append(lambda: pg.drop_database(database))
        name = conninfo_parts(database)["dbname"]
        catalog = f"postgres:dbname={name} host={net.address} port={forward.port} user={parts.get('user', 'postgres')}"
        h = Hosts(net, tmp, catalog, tmp / "shared-lake")
        h.shared.mkdir()
        # off loopback, Redis wants a password (its protected mode), as a broker other hosts reach should
        redis = Stack(tmp / "broker", host=net.address, password=uuid.uuid4().hex)
        cleanup.append(redis.stop_all)  # also when it starts but does not answer
        redis.start_redis()
        h.broker_url, h.broker_password = redis.broker_url, redis.password
        for i in HOSTS:
            h.stacks[i] = Stack(tmp / f"host{i}" / "run", port=redis.port, host=net.address, wrap=net.wrap(i),
                                password=redis.password)
            h.stacks[i].run_dir.mkdir(parents=True)
            cleanup.append(h.stacks[i].stop_all)
        for i in HOSTS:
            h.start_worker(i, wait=False)
        for i in HOSTS:  # each host's searcher (and two hosts' writers) load beside the workers
            h.probes[i] = Agent("probe", net.wrap(i), h.env(i, broker=False), tmp / f"host{i}" / "probe.log")
            cleanup.append(h.probes[i].close)
        for i in (1, 2):
            h.writers[i] = Agent("writer", net.wrap(i), h.env(i, broker=True), tmp / f"host{i}" / "writer.log")
            cleanup.append(h.writers[i].close)
        for i in HOSTS:
            h.stacks[i].wait_for_ready(h.worker(i))
        for agent in [*h.probes.values(), *h.writers.values()]:
            assert agent.reply()["ready"]
        rng = random.Random(34)
        seed = [{"id": f"seed-{j}", "namespace": NAMESPACE, "content": _text(rng, 10)} for j in range(SEED)]
        done = h.writers[1].ask("remember", records=seed)
        assert sorted(done["ids"]) == sorted(r["id"] for r in seed)
        for probe in h.probes.values():  # each host reads the store once (a host without a base builds one)
            probe.send("reach", id="seed-0", text=seed[0]["content"], version=done["version"], namespace=NAMESPACE)
        for probe in h.probes.values():
            assert probe.reply()["store_version"] >= done["version"]
        print(f"\nthree hosts up (network, broker, catalog, 3 workers, seed of {SEED}) in {time.perf_counter() - t0:.1f} s")
        yield h
    finally:
        for step in reversed(cleanup):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - the rest is cleaned up all the same
                print(f"cleanup step failed: {exc!r}")
        left = net.close()
        assert not left, f"network namespaces or links left behind: {left}"


def _burst(writer: Agent, prefix: str, n: int, out: dict) -> None:
    writer.send("burst", prefix=prefix, n=n, namespace=NAMESPACE, text="concurrent")
    acked, failed = {}, {}
    while True:
        line = writer.reply(timeout=300)
        if line.get("done"):
            break
        (failed if "failed" in line else acked)[line["id"]] = line
    out[prefix] = (acked, failed)


def _bursts(h: Hosts, n: int, prefix: str, during=None) -> tuple[dict, dict]:
    out: dict = {}
    threads = [threading.Thread(target=_burst, args=(h.writers[i], f"{prefix}{i}", n, out)) for i in (1, 2)]
    for t in threads:
        t.start()
    if during is not None:
        during()
    for t in threads:
        t.join(360)
    acked = {k: v for a, _ in out.values() for k, v in a.items()}
    failed = {k: v for _, f in out.values() for k, v in f.items()}
    assert len(out) == 2, "a writer did not finish"
    return acked, failed


def test_writes_from_two_hosts_at_once_are_all_present_once(hosts):
    t0 = time.perf_counter()
    acked, failed = _bursts(hosts, 8, "two")
    took = sorted(a["acked"] - a["sent"] for a in acked.values())
    assert not failed, f"writes refused: {list(failed.values())[:3]}"
    assert len(acked) == 16
    ids, _ = hosts.lake_ids()
    missing = sorted(set(acked) - set(ids))
    twice = sorted(i for i, n in ids.items() if n > 1)
    assert not missing, f"acknowledged writes missing from the lake: {missing}"
    assert not twice, f"memories present more than once: {twice}"
    print(f"\n16 one-memory writes from two hosts at once in {time.perf_counter() - t0:.1f} s, each present once; "
          f"sent -> acknowledged p50 {statistics.median(took) * 1000:.0f} ms, max {took[-1] * 1000:.0f} ms; "
          f"the ingest worker's own time p50: " + ", ".join(
              f"{k} {statistics.median(a['seconds'].get(k, 0.0) for a in acked.values()) * 1000:.0f} ms"
              for k in sorted({k for a in acked.values() for k in a["seconds"]})))


def test_each_acknowledged_write_is_answered_on_every_host_within_the_bound(hosts):
    delays: dict[int, list[float]] = {i: [] for i in HOSTS}
    alone: list[float] = []  # a write's own time, sent -> acknowledged, no other write at the same time
    for k in range(5):
        writer = hosts.writers[1 + k % 2]
        marker = "zq" + uuid.uuid4().hex[:10].translate(str.maketrans("0123456789", "ghijklmnop"))
        mid = f"visible-{k}"
        for i in HOSTS:
            hosts.probes[i].send("watch", id=mid, text=marker, namespace=NAMESPACE, within=30.0)
        done = writer.ask("remember", records=[{"id": mid, "namespace": NAMESPACE, "content": f"{marker} visible"}])
        for i in HOSTS:
            seen = hosts.probes[i].reply(timeout=60)
            assert seen["seen"] is not None, f"host {i} never answered {mid} (written at snapshot {done['version']})"
            delays[i].append(seen["seen"] - done["acked"])
        alone.append(done["acked"] - done["sent"])
    # with min_version: answered at the first search, however recently the host polled
    reach: dict[int, list[float]] = {i: [] for i in HOSTS}
    plain: dict[int, list[float]] = {i: [] for i in HOSTS}  # the same search again, the state already current
    for k in range(3):
        writer = hosts.writers[1 + k % 2]
        marker = "zq" + uuid.uuid4().hex[:10].translate(str.maketrans("0123456789", "ghijklmnop"))
        mid = f"reach-{k}"
        done = writer.ask("remember", records=[{"id": mid, "namespace": NAMESPACE, "content": f"{marker} reached"}])
        for i in HOSTS:
            got = hosts.probes[i].ask("reach", id=mid, text=marker, version=done["version"], namespace=NAMESPACE)
            assert got["found"], f"host {i}: a search with min_version={done['version']} did not answer {mid}"
            assert got["store_version"] >= done["version"]
            reach[i].append(got["seconds"])
            plain[i].append(got["plain_seconds"])
    every = [d for ds in delays.values() for d in ds]
    print("\nwrite acknowledged -> answered by a search (no min_version), per host, p50 / max over 5 writes: "
          + "; ".join(f"host {i} {statistics.median(ds) * 1000:.0f} / {max(ds) * 1000:.0f} ms"
                      for i, ds in delays.items())
          + f"; all: p50 {statistics.median(every) * 1000:.0f} ms (load {os.getloadavg()[0]:.1f}); "
          f"these writes, one at a time, sent -> acknowledged p50 {statistics.median(alone) * 1000:.0f} ms")
    print("one search with min_version=v right after the write, per host, p50 / max over 3 writes: "
          + "; ".join(f"host {i} {statistics.median(s) * 1000:.0f} / {max(s) * 1000:.0f} ms" for i, s in reach.items())
          + "; the same search again: "
          + "; ".join(f"host {i} {statistics.median(s) * 1000:.0f} ms" for i, s in plain.items()))
    # the goal is 1 s p50 on a quiet machine; a shared one (load 15 on 2 cores) saw 1.6 s, hence the room
    assert statistics.median(every) < 3.0, f"write-to-visible p50 {statistics.median(every):.2f} s"
    assert max(every) < 15.0, f"a write took {max(every):.2f} s to be answered"


def _held(log: str) -> set[str]:
    received = set(re.findall(r"Task ingest\.remember\[([0-9a-f-]+)\] received", log))
    done = set(re.findall(r"Task ingest\.remember\[([0-9a-f-]+)\] (?:succeeded|failed|raised)", log))
    return received - done


def test_one_hosts_worker_killed_during_writes_loses_nothing_acknowledged(hosts):
    killed: dict = {}

    def kill_host1_while_it_holds_a_write() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if _held(hosts.log(1)):
                hosts.kill_worker(1)
                # what it held when it died (one may have finished since it was seen)
                killed.update(at=time.time(), held=_held(hosts.log(1)))
                return
            time.sleep(0.005)

    t0 = time.perf_counter()
    acked, failed = _bursts(hosts, 8, "kill", during=kill_host1_while_it_holds_a_write)
    span = time.perf_counter() - t0
    assert killed, "host 1's worker held no write to kill it with"
    assert killed["held"], "the write host 1's worker held finished before the kill landed (rare): run again"
    assert not failed, f"writes failed after the kill: {list(failed.values())[:3]}"
    ids, latest = hosts.lake_ids()  # the store opens, from a process that was not there
    assert not sorted(set(acked) - set(ids)), "acknowledged writes lost"
    assert not [i for i, n in ids.items() if n > 1], "a memory present twice"
    # the message the killed worker held ran on another host's worker (delivered again)
    others = hosts.log(2) + hosts.log(3)
    rerun = {t for t in killed["held"] if re.search(rf"ingest\.remember\[{t}\] succeeded", others)}
    replayed = sum(1 for a in acked.values() if a["replayed"])
    hosts.start_worker(1)  # the host comes back and follows the lake
    print(f"\nhost 1's worker SIGKILLed holding {len(killed['held'])} write(s) during 16 writes from hosts 1 and 2 "
          f"({span:.1f} s): {len(acked)} acknowledged, all present once; {len(rerun)} of the held ones run again on "
          f"host 2 or 3, {replayed} answered as a replay; latest snapshot {latest}")
    assert rerun == killed["held"], f"held by the killed worker, never run elsewhere: {killed['held'] - rerun}"


def test_the_same_query_gives_the_same_results_on_every_host(hosts):
    import workers
    from workers.api import search
    from workers.settings import WorkerSettings

    _, latest = hosts.lake_ids()
    answers = {i: hosts.probes[i].ask("queries", queries=QUERIES, min_version=latest, namespace=NAMESPACE)["answers"]
               for i in HOSTS}
    for q, a1, a2, a3 in zip(QUERIES, answers[1], answers[2], answers[3]):
        assert a1["hits"], f"{q} answered nothing"
        assert a1["hits"] == a2["hits"] == a3["hits"], f"{q}: hosts differ:\n{a1}\n{a2}\n{a3}"
    # A host joining now has no base: it builds one at the latest snapshot,
    # while the others read the base of the seed's snapshot and every write
    # since as deltas; base + deltas answers as the newer base does.
    (hosts.tmp / "late").mkdir()
    late = Agent("probe", hosts.net.wrap(3), {**hosts.env(3, broker=False),
                                              "DIMPLE_DATA_DIR": str(hosts.tmp / "late" / "data")},
                 hosts.tmp / "late" / "probe.log")
    try:
        assert late.reply()["ready"]
        later = late.ask("queries", queries=QUERIES, min_version=latest, namespace=NAMESPACE)["answers"]
    finally:
        late.close()
    bases = {p.parts[-4]: p.name for p in hosts.tmp.glob("*/data/indexes/base-*.duckdb")}
    assert bases["late"] == f"base-{latest}.duckdb" and bases["host1"] != bases["late"], bases
    for q, a1, a4 in zip(QUERIES, answers[1], later):
        assert a4["hits"] == a1["hits"], f"{q}: a host with a base at {latest} answers otherwise:\n{a1}\n{a4}"
    workers.configure(WorkerSettings(**_store(hosts), broker_url=hosts.broker_url,
                                     broker_password=hosts.broker_password))
    try:
        for _ in range(2):  # through the broker: whichever host's workers take each stage
            for q, a in zip(QUERIES, answers[1]):
                got = search(q["text"], mode=q["mode"], namespace=NAMESPACE, top_k=10, min_version=latest)
                assert [[r.id, r.rank, r.score] for r in got.results] == a["hits"], f"{q} through the broker differs"
    finally:
        workers.configure(WorkerSettings(**_store(hosts)))
    print(f"\n{len(QUERIES)} queries (keyword, semantic, hybrid) at snapshot {latest}: the same ids, ranks and scores "
          f"on the three hosts, on a host that joined last (bases {bases}) and twice through the broker")
