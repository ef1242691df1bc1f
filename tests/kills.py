"""SIGKILL during writes: the checks behind ``tests/slow/test_lake_kill.py``
(on each catalog) and ``ops/bench/lake_kills.py`` (forty kills, measured).

``kill_writer`` runs ``python -m tests.kills writer``, a process doing what
the ``ingest`` worker does (``pipeline.store.writes.write`` with a reader it
holds and the message's write id) with the default settings but the hash
embedder: batches of new memories, replacements and forgets, one write id
each, each announced before it is sent and acknowledged after it returned.
The parent kills it with SIGKILL at a random moment and starts the next
writer (a fresh process) that opens the store, reads every id ever written,
then delivers again the write in flight at the kill (twice) and an
acknowledged write that a later one overwrote (once), as a broker delivers a
message again. Checked each round: the store opens; the write in flight
landed whole or not at all; every acknowledged write is there with its
content; no acknowledged forget came back; a write delivered again is applied
once (the second delivery of the one in flight, and the overwritten one,
answer ``replayed`` and change nothing; no write id is recorded twice in the
lake's ``writes`` table).

``IngestWorkerKills`` is the real ``ingest`` worker (``tests/slow/test_lake_kill.py``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.settings import Settings, StoreSettings
from pipeline.store.lake.follow import reader_for
from pipeline.store.writes import get, parse_records, write
from workers.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]

def store_env(store: StoreSettings) -> dict[str, str]:
    """``store`` as the ``DIMPLE_STORE__*`` variables a worker process reads."""
    fields = store.model_dump(exclude_defaults=True, mode="json")
    return {f"DIMPLE_STORE__{k.upper()}": str(v) for k, v in fields.items()}


def settings_for(data_dir: Path, store: StoreSettings | None = None) -> Settings:
    """The default settings but the hash embedder (``store``: the lake's catalog and data path)."""
    return WorkerSettings(data_dir=data_dir, embedding_model="hash-64", store=store or StoreSettings(),
                          _env_file=None)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def check_store(settings: Settings, remembered: set[str], forgotten: set[str], maybe: set[str]) -> None:
    """The store opens; every acknowledged write is there; no acknowledged forget came back."""
    reader = reader_for(settings)
    try:
        snap = reader.snapshot()
        assert snap is not None
        every = sorted(remembered | forgotten | maybe)
        live = {m["id"] for m in get(settings, every, reader=reader)}
        lost = (remembered - forgotten) - live
        assert not lost, f"acknowledged writes lost: {sorted(lost)[:5]}"
        back = forgotten & live
        assert not back, f"forgotten memories came back: {sorted(back)[:5]}"
    finally:
        reader.close()


def seed(settings: Settings, n: int = 300) -> dict[str, str | None]:
    """``n`` memories in one write (the store's first base); their ids and contents."""
    records = [{"id": f"base-{i}", "namespace": "k", "content": f"base memory {i} about things"} for i in range(n)]
    write(settings, parse_records(records, settings))
    return {r["id"]: r["content"] for r in records}


# -- a writer killed at random, the store checked by a fresh process -------------------
@dataclass
class Write:
    """One write as a broker message carries it: its id, the memories it
    remembers (id -> content) and the ids it forgets."""

    wid: str
    remember: dict[str, str] = field(default_factory=dict)
    forget: list[str] = field(default_factory=list)

    def after(self) -> dict[str, str | None]:
        """What each id it names reads once it landed (None: not live)."""
        return {**self.remember, **dict.fromkeys(self.forget)}

    def send(self, settings: Settings, reader: Any) -> Any:
        records = [{"id": m, "namespace": "k", "content": c} for m, c in self.remember.items()]
        return write(settings, parse_records(records, settings) if records else None, forget=self.forget or None,
                     reader=reader, write_id=self.wid)


def _next_write(rng: random.Random, wid: str, live: list[str]) -> Write:
    """A forget of 1-3 live memories (20%), a replacement of 1-4 (25%), else new
    memories: one (60% of those) or a batch of 2-30 (more than DuckLake inlines
    in the catalog: a Parquet file)."""
    roll = rng.random()
    if roll < 0.2 and len(live) > 3:
        return Write(wid, forget=rng.sample(live, rng.randint(1, 3)))
    if roll < 0.45 and live:
        return Write(wid, remember={m: f"memory {m} replaced by {wid}" for m in rng.sample(live, rng.randint(1, 4))})
    n = 1 if rng.random() < 0.6 else rng.randint(2, 30)
    return Write(wid, remember={f"{wid}-{j}": f"kill test memory {wid}-{j} words" for j in range(n)})


def _opened(settings: Settings, req: dict) -> tuple[dict[str, Any], Any]:
    """Open the store (compacted first when asked), read the ids asked, deliver
    the writes asked again in order, and read again; (what it found, the reader)."""
    from pipeline.store.maintenance import compact as compact_store

    if req["compact"]:
        compact_store(settings, wait=True)
    reader = reader_for(settings)
    snap = reader.snapshot()
    out: dict[str, Any] = {"opened": snap is not None}
    out["before"] = {m["id"]: m["content"] for m in get(settings, req["ids"], reader=reader)}
    out["replayed"] = [Write(**w).send(settings, reader).replayed for w in req["redeliver"]]
    out["after"] = {m["id"]: m["content"] for m in get(settings, req["ids"], reader=reader)}
    out["twice"] = twice_applied(reader)
    return out, reader


def twice_applied(reader: Any) -> list[str]:
    """The write ids the lake's ``writes`` table records more than once (a write applied twice)."""
    with reader.lake.lock:
        lake = reader.lake.lake()
        assert lake is not None
        return [r[0] for r in lake.con.execute(
            "SELECT write_id FROM writes GROUP BY write_id HAVING count(*) > 1").fetchall()]


def _writer(settings_json: str, request_path: str, tag: str, seed_: str) -> None:
    """A process starting as a worker does after a kill: it opens the store,
    and the broker hands it the messages the killed one held (``_opened``,
    printed as the first line); then, unless told otherwise, it writes
    without pause until killed, announcing each write and its acknowledgement."""
    settings = WorkerSettings.model_validate_json(settings_json)
    req = json.loads(Path(request_path).read_text())
    found, reader = _opened(settings, req)  # a reader held, as a worker holds its own
    print(json.dumps(found), flush=True)
    if not req["write"]:
        return
    rng = random.Random(int(seed_))
    live = sorted(m for m, c in found["after"].items() if c is not None)
    i = 0
    while True:
        w = _next_write(rng, f"{tag}-{i}", live)
        print(json.dumps({"send": w.__dict__}), flush=True)
        done = w.send(settings, reader)
        print(json.dumps({"ack": w.wid, "replayed": done.replayed}), flush=True)
        gone = set(w.forget)
        live = [m for m in live if m not in gone] + [m for m in w.remember if m not in live]
        i += 1


@dataclass
class KillReport:
    """What ``kill_writer`` did and found; ``problems`` empty when every check held."""

    catalog: str  # the lake's catalog: sqlite, postgres
    kills: int = 0
    acknowledged: int = 0  # writes acknowledged to the writer before its kill
    in_flight: int = 0  # kills that caught a write sent and not acknowledged
    landed: int = 0  # of those, writes that had landed before the kill (replayed when delivered again)
    redelivered: int = 0  # writes delivered again by the checks
    lost: int = 0  # acknowledged writes not read back as written (must be 0)
    back: int = 0  # acknowledged forgets undone (must be 0)
    memories: int = 0  # ids ever written
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "problems"} | {"problems": self.problems[:20]}


def _mismatches(state: dict[str, str | None], read: dict[str, str], ids) -> tuple[list[str], list[str]]:
    """(ids read otherwise than the acknowledged writes left them, ids forgotten that came back)."""
    wrong = [m for m in ids if read.get(m) != state.get(m)]
    return wrong, [m for m in wrong if state.get(m) is None]


def kill_writer(settings: Settings, rounds: int, rng: random.Random, *, window: tuple[float, float] = (0.05, 1.0),
                strict: bool = True, log=None) -> KillReport:
    """Kill ``python -m tests.kills writer`` ``rounds`` times, each after a
    random ``window`` of writing; the next writer (and, after the last kill,
    one that compacts first and does not write) opens the store, delivers the
    writes again and reports what it read, which is checked (the module's
    doc). ``strict``: raise at the first problem; else count it."""
    scratch = settings.data_dir.parent / f"kills-{settings.data_dir.name}"
    scratch.mkdir(parents=True, exist_ok=True)
    errors = scratch / "children.log"
    report = KillReport(settings.lake_catalog.split(":")[0])
    t0 = time.perf_counter()
    state: dict[str, str | None] = seed(settings)  # id -> content as the acknowledged writes left it (None: forgotten)
    history: list[Write] = []  # every write that landed, in order

    def check(r: int, inflight: Write | None, redeliver: list[Write], got: dict) -> None:
        problems = [] if got["opened"] else ["the store did not open"]
        touched = set(inflight.after()) if inflight else set()
        wrong, back = _mismatches(state, got["before"], [m for m in state if m not in touched])
        report.lost += len(wrong) - len(back)
        report.back += len(back)
        problems += [f"{m}: read {got['before'].get(m)!r}, acknowledged {state.get(m)!r}" for m in wrong[:5]]
        if inflight is not None:
            post = inflight.after()
            pre = {m: state.get(m) for m in post}
            seen = {m: got["before"].get(m) for m in post}
            landed = seen == post
            if not landed and seen != pre:
                problems.append(f"write {inflight.wid} in flight at the kill landed in part: {seen} (before {pre})")
            if got["replayed"][0] != landed:
                problems.append(f"write {inflight.wid}: landed {landed} but its first redelivery said "
                                f"replayed={got['replayed'][0]}")
            if not got["replayed"][1]:
                problems.append(f"write {inflight.wid} delivered a second time was applied again")
            report.in_flight += 1
            report.landed += landed
            state.update(post)
            history.append(inflight)
        skip = 2 if inflight else 0
        for w, replayed in zip(redeliver[skip:], got["replayed"][skip:]):
            if not replayed:
                problems.append(f"acknowledged write {w.wid} delivered again was applied again")
        report.redelivered += len(redeliver)
        wrong, back = _mismatches(state, got["after"], sorted(state))
        report.lost += len(wrong) - len(back)
        report.back += len(back)
        problems += [f"after redelivery {m}: read {got['after'].get(m)!r}, expected {state.get(m)!r}"
                     for m in wrong[:5]]
        if got["twice"]:
            problems.append(f"write ids recorded twice: {got['twice'][:5]}")
        report.problems += [f"kill {r + 1}: {p}" for p in problems]
        if strict and problems:
            raise AssertionError(f"after kill {r + 1} ({report.catalog} catalog): " + "; ".join(problems))

    inflight: Write | None = None
    redeliver: list[Write] = []
    for r in range(rounds + 1):
        last = r == rounds
        request = scratch / "request.json"
        request.write_text(json.dumps({"ids": sorted(state | (inflight.after() if inflight else {})),
                                       "redeliver": [w.__dict__ for w in redeliver], "compact": last,
                                       "write": not last}))
        with open(errors, "ab") as err:
            proc = subprocess.Popen([sys.executable, "-m", "tests.kills", "writer", settings.model_dump_json(),
                                     str(request), f"w{r}", str(rng.randrange(2**32))], stdout=subprocess.PIPE,
                                    stderr=err, text=True, env=_env(), cwd=ROOT)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first, f"the writer did not start: {errors.read_text()[-3000:]}"
        if r > 0:
            check(r - 1, inflight, redeliver, json.loads(first))
        if last:
            assert proc.wait(60) == 0
            break
        time.sleep(rng.uniform(*window))
        assert proc.poll() is None, f"the writer stopped before its kill: {errors.read_text()[-3000:]}"
        proc.send_signal(signal.SIGKILL)
        out = proc.stdout.read()  # not communicate(): it would skip what readline() buffered
        proc.wait(60)
        report.kills += 1
        sent: dict[str, Write] = {}
        inflight = None
        for line in out.splitlines():
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line, cut by the kill: its write was not acknowledged
            if "send" in msg:
                inflight = sent[msg["send"]["wid"]] = Write(**msg["send"])
            elif "ack" in msg:
                w = sent[msg["ack"]]
                assert not msg["replayed"], f"a new write id {w.wid} was answered as a replay"
                state.update(w.after())
                history.append(w)
                report.acknowledged += 1
                inflight = None
        redeliver = [inflight, inflight] if inflight is not None else []
        newest: dict[str, int] = {}
        for i, w in enumerate(history + ([inflight] if inflight else [])):
            newest.update(dict.fromkeys(w.after(), i))
        overwritten = [w for i, w in enumerate(history) if any(newest[m] > i for m in w.after())]
        redeliver += overwritten[-1:]  # the newest acknowledged write a later one overwrote
        if log is not None:
            log(f"kill {r + 1}/{rounds}: {report.acknowledged} acknowledged so far, in flight "
                f"{'none' if inflight is None else inflight.wid}")
    report.memories = len(state)
    report.seconds = time.perf_counter() - t0
    return report


# -- the real ingest worker: a Celery worker process killed with its pool -----------------
class IngestWorkerKills:
    """A real ``ingest`` worker (Celery, the real model, the default settings)
    on a redis-server of its own, SIGKILLed with its pool processes and
    started again; writes go through ``workers.api`` as an agent sends them."""

    def __init__(self, run_dir: Path, data_dir: Path, rng: random.Random, store: StoreSettings | None = None):
        from ops.stack import Stack

        self.stack = Stack(run_dir)
        self.data_dir = data_dir
        self.rng = rng
        self.store = store or StoreSettings()
        self.held: tuple[Any, str, str] | None = None  # the write in flight at the last kill: (handle, kind, id)
        self.in_flight: str | None = None  # the task id of the write being awaited now
        self.incarnation = 0
        self.remembered: set[str] = set()
        self.forgotten: set[str] = set()
        self.uncertain: set[str] = set()  # a write in flight when the worker died
        self.sent: set[str] = set()
        self.task_of: dict[str, str] = {}  # a memory's id -> the task id (write id) of the write that remembered it

    def __enter__(self) -> IngestWorkerKills:
        import workers
        from workers.app import app

        self.stack.start_redis()
        self.settings = WorkerSettings(data_dir=self.data_dir, broker_url=self.stack.broker_url, store=self.store,
                                       _env_file=None)
        workers.configure(self.settings)
        self.app = app
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.stop_all()

    @property
    def name(self) -> str:
        return f"k-ingest-{self.incarnation}"

    def start(self) -> None:
        self.incarnation += 1
        self.stack.start_worker(self.name, "ingest", concurrency=2,
                                env={"DIMPLE_DATA_DIR": str(self.data_dir), **store_env(self.store)})
        self.stack.wait_for_ready(self.name)

    def kill(self) -> None:
        proc = self.stack.procs.pop(self.name)
        os.killpg(proc.pid, signal.SIGKILL)  # the main process and its pool
        proc.wait(30)

    def _await(self, handle, killed) -> Any:
        """The write's result, or None when the worker was killed first (the
        write may or may not have landed)."""
        from pipeline.errors import QueryTimeoutError

        while True:
            try:
                return handle.get(timeout=0.2)
            except QueryTimeoutError:
                if killed():
                    return None

    def writes_until(self, killed, tag: str) -> None:
        """Remember one memory at a time and forget every third, until ``killed()``."""
        from workers.api import forget_async, remember_async

        i = 0
        while not killed():
            mid = f"{tag}-{i}"
            self.sent.add(mid)
            handle = remember_async({"id": mid, "namespace": "k", "content": f"agent memory {mid}"})
            self.task_of[mid] = self.in_flight = handle.id
            if self._await(handle, killed) is None:
                self.uncertain.add(mid)
                self.held = (handle, "remember", mid)
                return
            self.remembered.add(mid)
            if i % 3 == 2:
                gone = f"{tag}-{i - 1}"
                handle = forget_async([gone])
                self.in_flight = handle.id
                if self._await(handle, killed) is None:
                    self.uncertain.add(gone)
                    self.held = (handle, "forget", gone)
                    return
                self.forgotten.add(gone)
            i += 1

    def check(self) -> None:
        check_store(WorkerSettings(data_dir=self.data_dir, store=self.store, _env_file=None), self.remembered - self.uncertain,
                    self.forgotten - self.uncertain, self.uncertain | self.sent)

    def drained(self, within: float = 120.0) -> None:
        """Wait until the ``ingest`` queue is empty and no message is held: every write sent has run."""
        deadline = time.monotonic() + within
        with self.app.connection_for_write() as conn:
            client = conn.default_channel.client
            while client.llen("ingest") or client.hlen("unacked"):
                assert time.monotonic() < deadline, "the writes sent were not run"
                time.sleep(0.2)

    def answers(self, task_id: str, runs: int, within: float = 30.0) -> list[str]:
        """What the workers logged for each run of task ``task_id`` (Celery's
        result backend keeps the first success only, so a second run's answer
        is read in the logs), once ``runs`` are there or after ``within`` s:
        ``drained`` can return while a worker runs the message (it looks in
        kombu's window between the BRPOP and the ``unacked`` record), before
        the run's line is logged."""
        deadline = time.monotonic() + within
        while True:
            found = [line for log in sorted(self.stack.run_dir.glob("k-ingest-*.log"))
                     for line in log.read_text(errors="replace").splitlines() if f"[{task_id}] succeeded" in line]
            if len(found) >= runs or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def holding(self) -> int:
        """How many messages a worker has taken and not acknowledged (Redis' ``unacked``)."""
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            return int(channel.client.hlen(channel.qos.unacked_key))

    def where(self, task_id: str | None) -> str:
        """Where the broker has the message of task ``task_id``: ``"held"`` (a
        worker took it and has not acknowledged it: Redis' ``unacked``),
        ``"queued"`` (no worker took it yet), or ``"taken"`` (acknowledged, or
        taken off the queue and not yet recorded as held: kombu's own window,
        ``workers/leases.py``)."""
        if task_id is None:
            return "taken"
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            client = channel.client
            if any(task_id in raw.decode(errors="replace") for raw in client.hvals(channel.qos.unacked_key)):
                return "held"
            if any(task_id in raw.decode(errors="replace") for raw in client.lrange("ingest", 0, -1)):
                return "queued"
        return "taken"


if __name__ == "__main__" and sys.argv[1:2] == ["writer"]:
    _writer(*sys.argv[2:6])
