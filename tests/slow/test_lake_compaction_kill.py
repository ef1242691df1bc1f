"""A compaction of the lake SIGKILLed midway (``store.engine = lake``, the
default settings): the store opens in a new process, every acknowledged write
is there, and the next compaction on this host runs at once: the dead
process's claim of ``compaction_head`` is taken over, not waited out
(``compaction.LEASE``). Slow: a store of a few thousand memories, so that the
kill lands inside the base build."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.store.lake import Lake
from pipeline.store.writes import parse_records, write
from tests.conftest import store_settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

_COMPACT_AT_ONCE = """
import json
from pipeline.settings import Settings
from pipeline.store.lake.compaction import compact_lake
print(json.dumps(compact_lake(Settings(), wait=False).as_dict()))
"""


def _env(settings) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DIMPLE_DATA_DIR": str(settings.data_dir),
            "DIMPLE_EMBEDDING_MODEL": settings.embedding_model, "DIMPLE_STORE__ENGINE": "lake",
            "DIMPLE_AUDIT_ENABLED": "false"}


def _head(settings) -> tuple[str | None, object]:
    with Lake.open(settings) as lake:
        return lake.con.execute("SELECT holder, claimed_at FROM compaction_head").fetchone()


def test_a_compaction_killed_midway_leaves_the_store_whole_and_the_next_one_runs_at_once(tmp_path):
    settings = store_settings(tmp_path)
    acknowledged: set[str] = set()
    for b in range(3):  # 3,000 memories, then small writes and a forget since the last base
        batch = [{"id": f"m{b}-{i}", "namespace": f"ns{i % 4}", "content": f"note {i} of batch {b} about topic {i % 37}"}
                 for i in range(1000)]
        write(settings, parse_records(batch, settings))
        acknowledged |= {r["id"] for r in batch}
    for i in range(5):
        write(settings, parse_records({"id": f"late{i}", "namespace": "ns0", "content": f"late note {i}"}, settings))
        acknowledged.add(f"late{i}")
    write(settings, forget=["m0-1", "m1-2"])
    acknowledged -= {"m0-1", "m1-2"}

    index = settings.lake_index_path
    proc = subprocess.Popen([sys.executable, "-m", "workers.cli", "compact"], cwd=tmp_path, env=_env(settings),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        # the base being built: under a name of its own (``.work`` while DuckDB
        # writes it, then renamed) until it is linked into place
        while not list(index.glob(f".base-*.{proc.pid}.*.duckdb*")):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the compaction never started its base"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()  # reaped, as a worker's parent reaps its pool process
    assert proc.returncode == -signal.SIGKILL
    holder, _ = _head(settings)
    assert holder is not None and holder.split(":")[1] == str(proc.pid), "killed while it held the claim"

    # the store opens in a new process, and holds every acknowledged write
    stats = subprocess.run([sys.executable, "-m", "workers.cli", "stats"], cwd=tmp_path, env=_env(settings),
                           capture_output=True, text=True, timeout=300)
    assert stats.returncode == 0, stats.stderr
    assert f"memories    {len(acknowledged)} in 4 namespace(s)" in stats.stdout
    with Lake.open(settings) as lake:
        assert {m.id for m in lake.read()} == acknowledged

    # the next compaction on this host takes the dead claim over at once (without waiting for it)
    again = subprocess.run([sys.executable, "-c", _COMPACT_AT_ONCE], cwd=tmp_path, env=_env(settings),
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout.strip().splitlines()[-1])
    assert report["ran"] and report["memories"] == len(acknowledged), report
    assert _head(settings)[0] is None  # given back
    with Lake.open(settings) as lake:
        assert {m.id for m in lake.read()} == acknowledged
        listed = [r[0] for r in lake.con.execute("SELECT path FROM indexes").fetchall()]
    assert report["base"] in listed and (index / report["base"]).is_file()
    # and deletes the base the killed one was building (a base's size): nothing but bases stays
    assert sorted(p.name for p in index.iterdir() if p.name.startswith(".")) == []
