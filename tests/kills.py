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

from pipeline.settings import Settings
from pipeline.store import segments
from pipeline.store.compact import compact
from pipeline.store.reader import Reader
from pipeline.store.writes import get, parse_records, write

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
    return Settings(data_dir=data_dir, embedding_model="hash-64", _env_file=None)


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
