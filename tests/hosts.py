"""Several hosts on one machine, for ``tests/slow/test_three_hosts.py`` and
``ops/bench/host_kills.py`` (``three_hosts``): each
"host" is a network namespace of its own (``ip netns``), joined to the root
namespace by a veth pair on a bridge the test creates (a private /24 of
10.77.0.0/16 that no interface here uses yet), so its processes reach the
broker and the catalog only over that network, as another machine would.

What is shared, and how (docs/LAKE.md, ops/RUNBOOK.md "Several hosts"):

- one redis-server, listening on the bridge's address (``Stack(host=...)``);
- one PostgreSQL catalog: a database of the server ``tests.lakes.find_postgres``
  finds (``DIMPLE_TEST_POSTGRES``, else 127.0.0.1:5432), reached through a
  ``socat`` forward from the bridge's address in the root namespace. Why a
  forward and not a server of the test's own on the bridge address: the
  system server listens on loopback only, and a server the test starts from
  ``initdb``/``postgres`` must run as a user other than root (PostgreSQL
  refuses root) while the namespaces need root: the forward reuses the one
  server the other lake tests use, and costs no initdb (seconds);
- one data path (a folder: the namespaces share the filesystem, as hosts
  share an NFS mount).

Each host keeps its own ``DIMPLE_DATA_DIR`` (its bases under ``indexes/``,
the DuckDB extension links) and runs its own processes under
``ip netns exec``. Everything is deleted at the end, also on failure.

``python -m tests.hosts writer`` and ``python -m tests.hosts probe`` are the
two kinds of process a test runs on a host, each reading one JSON command a
line on stdin and answering JSON lines on stdout (settings from the
environment, ``DIMPLE_*``): the writer is an agent writing through the
broker (``workers.api.remember``, so the ``ingest`` workers of any host run
it); the probe searches in-process (embedded: the query stages run in the
probe itself, against its host's data dir and the shared catalog), so an
answer it gives is that host's answer, whichever host's workers the broker
hands other queries to.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def missing() -> str | None:
    """What this machine lacks to run hosts in network namespaces (None: nothing)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the test as root, e.g. in a CI container)"
    for tool, package in (("ip", "iproute2"), ("socat", "socat"), ("redis-server", "redis-server")):
        if not shutil.which(tool):
            return f"{tool} not found: install it (Debian/Ubuntu: apt-get install {package})"
    probe = f"dimple-probe-{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"'ip netns add' failed here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Network:
    """A bridge in the root namespace with address ``.1`` of a free 10.77.X.0/24,
    and ``n`` namespaces, host ``i`` at ``.(10+i)`` on a veth pair to it.
    ``close()`` deletes every namespace and link it made (also half-made)."""

    def __init__(self, n: int):
        self.tag = uuid.uuid4().hex[:6]
        self.bridge = f"dmb{self.tag}"
        self.namespaces = [f"dimple-{self.tag}-h{i}" for i in range(1, n + 1)]
        self.veths = [f"dmv{self.tag}{i}" for i in range(1, n + 1)]
        used = _ip("-o", "-4", "addr").stdout
        subnet = next((x for x in range(77, 255) if f" 10.77.{x}." not in used), None)
        if subnet is None:
            raise RuntimeError("no free 10.77.X.0/24 for the test's bridge")
        self.prefix = f"10.77.{subnet}"
        self.address = f"{self.prefix}.1"

    def host_address(self, i: int) -> str:
        return f"{self.prefix}.{10 + i}"

    def open(self) -> Network:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, (ns, veth) in enumerate(zip(self.namespaces, self.veths), start=1):
                peer = f"dmp{self.tag}{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", ns)
                _ip("link", "set", veth, "master", self.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", ns, "addr", "add", f"{self.host_address(i)}/24", "dev", peer)
                _ip("-n", ns, "link", "set", peer, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> list[str]:
        """Delete what ``open`` made; what could not be deleted (empty: all gone)."""
        for ns in self.namespaces:
            _ip("netns", "del", ns, check=False)  # takes its end of the veth pair, and with it the pair
        for veth in self.veths:
            _ip("link", "del", veth, check=False)
        _ip("link", "del", self.bridge, check=False)
        listed = _ip("netns", "list").stdout + _ip("-o", "link").stdout
        return [name for name in [*self.namespaces, self.bridge, *self.veths] if name in listed]

    def wrap(self, i: int) -> tuple[str, ...]:
        """The command prefix that runs a process on host ``i`` (from 1)."""
        return ("ip", "netns", "exec", self.namespaces[i - 1])


class Forward:
    """``socat`` in the root namespace: ``address:port`` -> ``target_host:target_port``."""

    def __init__(self, address: str, target_host: str, target_port: int, log: Path):
        from ops.stack import free_port

        self.port = free_port()
        self.proc = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{self.port},bind={address},fork,reuseaddr", f"TCP:{target_host}:{target_port}"],
            stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
        import socket

        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection((address, self.port), timeout=0.5):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"socat did not listen on {address}:{self.port}; see {log}") from None
                time.sleep(0.05)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def conninfo_parts(conninfo: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in conninfo.split())


class Agent:
    """A ``python -m tests.hosts ROLE`` process on a host: ``send`` a command,
    ``reply`` reads its answer lines."""

    def __init__(self, role: str, wrap: tuple[str, ...], env: dict[str, str], log: Path):
        self.role = role
        self.proc = subprocess.Popen([*wrap, sys.executable, "-m", "tests.hosts", role], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=open(log, "ab"), text=True, env=env, cwd=ROOT,
                                     start_new_session=True)
        self.log = log
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, op: str, **args: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 120.0) -> dict:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.role} gave no answer within {timeout} s; see {self.log}") from None
        if line is None:
            raise AssertionError(f"{self.role} exited ({self.proc.wait()}); see {self.log}: "
                                 f"{self.log.read_text()[-3000:]}")
        answer = json.loads(line)
        if "error" in answer and answer.get("fatal"):
            raise AssertionError(f"{self.role}: {answer['error']}")
        return answer

    def ask(self, op: str, timeout: float = 120.0, **args: Any) -> dict:
        self.send(op, **args)
        return self.reply(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)


def skip_unless_hosts() -> None:
    why = missing()
    if why:
        pytest.skip(f"several hosts in network namespaces: {why}")


# -- three hosts up ---------------------------------------------------------------------
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

        with Lake.open(WorkerSettings(**store_kwargs(self))) as lake:
            return Counter(m.id for m in lake.read()), lake.latest_snapshot()


def store_kwargs(h: Hosts) -> dict:
    from pipeline.settings import StoreSettings

    return {"data_dir": h.tmp / "client", "store": StoreSettings(engine="lake", catalog=h.catalog, data_path=h.shared),
            "audit_enabled": False, "_env_file": None}


def text(rng, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@contextmanager
def three_hosts(tmp: Path, log=print) -> Iterator[Hosts]:
    """Three hosts up (network, broker, catalog, a worker on each, a writer on
    hosts 1 and 2, a probe on each) with a seed of ``SEED`` memories written
    and read on every host; all of it deleted on the way out, also on failure
    (``missing()`` says whether this machine can)."""
    import random

    from ops.stack import Stack
    from tests.lakes import find_postgres

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
        seed = [{"id": f"seed-{j}", "namespace": NAMESPACE, "content": text(rng, 10)} for j in range(SEED)]
        done = h.writers[1].ask("remember", records=seed)
        assert sorted(done["ids"]) == sorted(r["id"] for r in seed)
        for probe in h.probes.values():  # each host reads the store once (a host without a base builds one)
            probe.send("reach", id="seed-0", text=seed[0]["content"], version=done["version"], namespace=NAMESPACE)
        for probe in h.probes.values():
            assert probe.reply()["store_version"] >= done["version"]
        log(f"\nthree hosts up (network, broker, catalog, 3 workers, seed of {SEED}) in {time.perf_counter() - t0:.1f} s")
        yield h
    finally:
        for step in reversed(cleanup):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - the rest is cleaned up all the same
                log(f"cleanup step failed: {exc!r}")
        left = net.close()
        assert not left, f"network namespaces or links left behind: {left}"


def burst(writer: Agent, prefix: str, n: int, out: dict) -> None:
    writer.send("burst", prefix=prefix, n=n, namespace=NAMESPACE, text="concurrent")
    acked, failed = {}, {}
    while True:
        line = writer.reply(timeout=300)
        if line.get("done"):
            break
        (failed if "failed" in line else acked)[line["id"]] = line
    out[prefix] = (acked, failed)


def bursts(h: Hosts, n: int, prefix: str, during=None) -> tuple[dict, dict]:
    out: dict = {}
    threads = [threading.Thread(target=burst, args=(h.writers[i], f"{prefix}{i}", n, out)) for i in (1, 2)]
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


def held(log: str) -> set[str]:
    received = set(re.findall(r"Task ingest\.remember\[([0-9a-f-]+)\] received", log))
    done = set(re.findall(r"Task ingest\.remember\[([0-9a-f-]+)\] (?:succeeded|failed|raised)", log))
    return received - done


def kill_round(h: Hosts, victim: int, prefix: str, n: int) -> dict:
    """Bursts of ``n`` writes from hosts 1 and 2 (ids ``PREFIX1-j``,
    ``PREFIX2-j``) while host ``victim``'s worker is SIGKILLed with its pool as
    soon as its log shows a write received and not finished: whether it was
    killed, what it held then, the writes acknowledged and failed."""
    killed: dict = {}
    stop = threading.Event()

    def kill_when_holding() -> None:
        while not stop.is_set():
            if held(h.log(victim)):
                h.kill_worker(victim)
                killed.update(held=held(h.log(victim)))  # what it held when it died
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_when_holding, daemon=True)
    t0 = time.perf_counter()
    acked, failed = bursts(h, n, prefix, during=killer.start)
    stop.set()
    killer.join(30)
    return {"victim": victim, "killed": bool(killed), "held": sorted(killed.get("held", ())), "acked": acked,
            "failed": failed, "seconds": time.perf_counter() - t0}


# -- the processes on a host ---------------------------------------------------------
def _hits(results: Any) -> list[list]:
    return [[r.id, r.rank, r.score] for r in results.results]


def _writer() -> None:
    """An agent: remembers through the broker (any host's ``ingest`` worker runs it)."""
    import workers
    from workers.api import remember
    from workers.settings import WorkerSettings

    workers.configure(WorkerSettings())
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "remember":
            sent = time.time()
            done = remember(cmd["records"])
            print(json.dumps({"ids": done.ids, "version": done.version, "replayed": done.replayed,
                              "sent": sent, "acked": time.time(), "seconds": done.seconds}), flush=True)
        elif cmd["op"] == "burst":  # one-memory writes one after another, each acknowledged on its own line
            for j in range(cmd["n"]):
                mid = f"{cmd['prefix']}-{j}"
                sent = time.time()
                try:
                    done = remember({"id": mid, "namespace": cmd["namespace"],
                                     "content": f"{cmd['text']} burst memory {mid}"})
                except Exception as exc:  # noqa: BLE001 - not acknowledged: the test counts it as unknown
                    print(json.dumps({"id": mid, "failed": f"{type(exc).__name__}: {exc}"}), flush=True)
                    continue
                print(json.dumps({"id": mid, "version": done.version, "replayed": done.replayed,
                                  "sent": sent, "acked": time.time(), "seconds": done.seconds}), flush=True)
            print(json.dumps({"done": True}), flush=True)


def _probe() -> None:
    """A host's own searches, in-process (embedded) against its data dir."""
    import workers
    from pipeline.minilm import limit_blas_threads
    from pipeline.store.vector import compile_kernels
    from workers.api import search
    from workers.settings import WorkerSettings

    settings = WorkerSettings()
    workers.configure(settings)
    # as a search worker does at start: the compiled descent's float32 sums may
    # differ from numpy's in the last bit, and this process answers for its host
    compile_kernels()
    # and as an embed worker embeds: on its BLAS threads (DIMPLE_WORKER_BLAS_THREADS, 1);
    # OpenBLAS sums a product in another order on two threads, and a query's vector
    # differs in the last bits (~1e-7), enough to move a score's last digits
    limit_blas_threads(settings.worker_blas_threads)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        opts = {"namespace": cmd.get("namespace"), "top_k": cmd.get("top_k", 10)}
        if cmd["op"] == "watch":  # search until the id is answered (no min_version: the follower's own polls)
            deadline, tries = time.monotonic() + cmd.get("within", 30.0), 0
            while True:
                tries += 1
                got = search(cmd["text"], mode="keyword", **opts)
                if cmd["id"] in {r.id for r in got.results}:
                    print(json.dumps({"seen": time.time(), "tries": tries, "store_version": got.store_version}),
                          flush=True)
                    break
                if time.monotonic() > deadline:
                    print(json.dumps({"seen": None, "tries": tries}), flush=True)
                    break
        elif cmd["op"] == "reach":  # one search asking for the write's version
            t0 = time.perf_counter()
            got = search(cmd["text"], mode="keyword", min_version=cmd["version"], **opts)
            seconds = time.perf_counter() - t0
            t0 = time.perf_counter()
            search(cmd["text"], mode="keyword", **opts)  # what the search itself costs, the state already current
            print(json.dumps({"found": cmd["id"] in {r.id for r in got.results}, "seconds": seconds,
                              "plain_seconds": time.perf_counter() - t0, "store_version": got.store_version}),
                  flush=True)
        elif cmd["op"] == "queries":
            answers = []
            for q in cmd["queries"]:
                got = search(q["text"], mode=q["mode"], min_version=cmd.get("min_version"), **opts)
                answers.append({"hits": _hits(got), "store_version": got.store_version})
            print(json.dumps({"answers": answers}), flush=True)


if __name__ == "__main__":
    try:
        {"writer": _writer, "probe": _probe}[sys.argv[1]]()
    except Exception as exc:  # noqa: BLE001 - the test reads it as this process's answer
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "fatal": True}), flush=True)
        raise
