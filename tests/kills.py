"""SIGKILL during writes and during compaction: the checks behind
``tests/unit/test_segments_kill.py`` (a few rounds) and
``tests/slow/test_segments_kill.py`` (twenty of each).

A child process runs the same code the ``ingest`` worker runs
(``pipeline.store.writes.write``, ``pipeline.store.compact.compact``) with the
default settings but the hash embedder, and prints each acknowledged write;
the parent kills it with SIGKILL at a random moment and then checks that the
store opens, every acknowledged write is there, nothing acknowledged as
forgotten came back, and a compaction afterwards succeeds.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.settings import Settings
from pipeline.store import segments
from pipeline.store.compact import compact
from pipeline.store.reader import Reader
from pipeline.store.writes import get, parse_records, write
from workers.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]

_WRITER = """
import sys
from pipeline.settings import Settings
from pipeline.store.writes import parse_records, write
s = Settings(data_dir=sys.argv[1], embedding_model="hash-64", _env_file=None)
tag = sys.argv[2]
i = 0
print("ready", flush=True)
while True:
    mid = f"{tag}-{i}"
    write(s, parse_records([{"id": mid, "namespace": "k", "content": f"kill test memory {mid} words"}], s))
    print("R", mid, flush=True)
    if i % 3 == 2:
        gone = f"{tag}-{i - 1}"
        print("f", gone, flush=True)  # about to forget: gone or not if killed now
        write(s, forget=[gone])
        print("F", gone, flush=True)
    i += 1
"""

_COMPACTOR = """
import sys
from pipeline.settings import Settings
from pipeline.store.compact import compact
s = Settings(data_dir=sys.argv[1], embedding_model="hash-64", _env_file=None)
print("ready", flush=True)
compact(s, wait=True)
print("done", flush=True)
"""


def settings_for(data_dir: Path) -> Settings:
    return WorkerSettings(data_dir=data_dir, embedding_model="hash-64", _env_file=None)


def _child(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def check_store(settings: Settings, remembered: set[str], forgotten: set[str], maybe: set[str]) -> None:
    """The store opens; every acknowledged write is there; no acknowledged forget came back."""
    reader = Reader(settings.data_dir)
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


def seed(settings: Settings, n: int = 300) -> None:
    write(settings, parse_records(
        [{"id": f"base-{i}", "namespace": "k", "content": f"base memory {i} about things"} for i in range(n)], settings))


def kill_writes(data_dir: Path, rounds: int, rng: random.Random) -> None:
    settings = settings_for(data_dir)
    seed(settings)
    remembered: set[str] = set()
    forgotten: set[str] = set()
    uncertain: set[str] = set()  # forgets a kill interrupted: they may or may not have landed
    for r in range(rounds):
        proc = _child(_WRITER, str(data_dir), f"w{r}")
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        lines = [ln.split() for ln in out.splitlines() if ln.strip()]
        for kind, mid in lines:
            if kind in ("R", "F"):
                (remembered if kind == "R" else forgotten).add(mid)
        # the write in flight when it died may or may not have landed: a
        # remember of the next id, or a forget announced ("f") but not acknowledged
        maybe = {f"w{r}-{i}" for i in range(len(lines) + 2)}
        uncertain |= {mid for kind, mid in lines if kind == "f"} - forgotten
        check_store(settings, remembered - uncertain, forgotten, maybe | uncertain)
    compact(settings, wait=True)
    check_store(settings, remembered - uncertain, forgotten, uncertain)


def kill_compactions(data_dir: Path, rounds: int, rng: random.Random) -> None:
    settings = settings_for(data_dir)
    seed(settings, 2000)
    remembered = {f"base-{i}" for i in range(2000)}
    forgotten: set[str] = set()
    t0 = time.perf_counter()
    compact(settings, wait=True)  # nothing pending: measures nothing; time one real run below
    for r in range(rounds):
        for j in range(3):
            mid = f"c{r}-{j}"
            write(settings, parse_records([{"id": mid, "namespace": "k", "content": f"delta {mid}"}], settings))
            remembered.add(mid)
        gone = rng.choice(sorted(remembered - forgotten))
        write(settings, forget=[gone])
        forgotten.add(gone)
        if r == 0:
            t0 = time.perf_counter()
            compact(settings, wait=True)
            span = time.perf_counter() - t0
            continue
        proc = _child(_COMPACTOR, str(data_dir))
        time.sleep(rng.uniform(0.0, span * 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        check_store(settings, remembered, forgotten, set())
    compact(settings, wait=True)
    check_store(settings, remembered, forgotten, set())
    manifest = segments.read_manifest(settings.data_dir)
    assert manifest is not None
    on_disk = {f"{segments.SEGMENTS}/{p.name}" for p in (settings.data_dir / segments.SEGMENTS).iterdir()}
    assert on_disk <= manifest.files(), f"stray files after compaction: {sorted(on_disk - manifest.files())}"


# -- the real ingest worker: a Celery worker process killed with its pool -----------------
class IngestWorkerKills:
    """A real ``ingest`` worker (Celery, the real model, the default settings)
    on a redis-server of its own, SIGKILLed with its pool processes and
    started again; writes go through ``workers.api`` as an agent sends them."""

    def __init__(self, run_dir: Path, data_dir: Path, rng: random.Random):
        from ops.stack import Stack

        self.stack = Stack(run_dir)
        self.data_dir = data_dir
        self.rng = rng
        self.incarnation = 0
        self.remembered: set[str] = set()
        self.forgotten: set[str] = set()
        self.uncertain: set[str] = set()  # a write in flight when the worker died
        self.sent: set[str] = set()

    def __enter__(self) -> IngestWorkerKills:
        import workers
        from workers.app import app

        self.stack.start_redis()
        self.settings = WorkerSettings(data_dir=self.data_dir, broker_url=self.stack.broker_url, _env_file=None)
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
        self.stack.start_worker(self.name, "ingest", concurrency=2, env={"DIMPLE_DATA_DIR": str(self.data_dir)})
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
            done = self._await(remember_async({"id": mid, "namespace": "k", "content": f"agent memory {mid}"}), killed)
            if done is None:
                self.uncertain.add(mid)
                return
            self.remembered.add(mid)
            if i % 3 == 2:
                gone = f"{tag}-{i - 1}"
                done = self._await(forget_async([gone]), killed)
                if done is None:
                    self.uncertain.add(gone)
                    return
                self.forgotten.add(gone)
            i += 1

    def check(self) -> None:
        check_store(WorkerSettings(data_dir=self.data_dir, _env_file=None), self.remembered - self.uncertain,
                    self.forgotten - self.uncertain, self.uncertain | self.sent)

    def redeliver_unacked(self) -> int:
        """What Redis hands out again once the visibility timeout has passed
        (kombu's ``restore_visible``, with the hour skipped): the messages the
        killed workers held go back to their queue."""
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            qos = channel.qos
            held = channel.client.hlen(qos.unacked_key)
            qos.visibility_timeout = 0  # this connection's own QoS (a cached property)
            qos.restore_visible(num=10_000, interval=1)
        return held
