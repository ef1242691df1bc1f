"""A compaction of the lake killed midway (``store.engine = lake``, the
default settings). A compaction runs in a process of its own
(``pipeline.store.maintenance``): one that dies by a signal (DuckLake's
maintenance calls have died with a segmentation fault) is run again by its
caller, which lives on and reports the compaction done. Killed with its
caller, it leaves the store whole: the store opens in a new process with
every acknowledged write, and the next compaction on this host runs at
once: the dead process's claim of ``compaction_head`` is taken over, not
waited out (``compaction.LEASE``). Slow: a store of a few thousand
memories, so that each kill lands inside the base build."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.processes import gone
from pipeline.store.lake import Lake
from pipeline.store.lake.derive import _BUILD
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


def _write(settings, acknowledged: set[str], tag: str) -> None:
    """3,000 memories, then small writes and a forget since the last base."""
    for b in range(3):
        batch = [{"id": f"{tag}{b}-{i}", "namespace": f"ns{i % 4}",
                  "content": f"note {i} of batch {b}{tag} about topic {i % 37}"} for i in range(1000)]
        write(settings, parse_records(batch, settings))
        acknowledged |= {r["id"] for r in batch}
    for i in range(5):
        write(settings, parse_records({"id": f"{tag}late{i}", "namespace": "ns0", "content": f"late note {i}"},
                                      settings))
        acknowledged.add(f"{tag}late{i}")
    write(settings, forget=[f"{tag}0-1", f"{tag}1-2"])
    acknowledged -= {f"{tag}0-1", f"{tag}1-2"}


def _building(settings, proc: subprocess.Popen) -> int:
    """The pid of the process building the compaction's base, once it builds
    (a file of its own, named as ``derive._BUILD`` reads it: its snapshot,
    host, pid and thread, ``.work`` while DuckDB writes it, then renamed
    until it is linked into place)."""
    deadline = time.monotonic() + 240
    while True:
        found = [m for p in settings.lake_index_path.glob(".base-*") if (m := _BUILD.fullmatch(p.name))]
        if found:
            return int(found[0]["pid"])
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the compaction never started its base"
        time.sleep(0.005)


def _compacting(settings, tmp_path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "workers.cli", "compact"], cwd=tmp_path,
                            env=_env(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_a_compaction_killed_midway_is_run_again_or_leaves_the_store_whole_for_the_next(tmp_path):
    settings = store_settings(tmp_path)
    acknowledged: set[str] = set()
    _write(settings, acknowledged, "m")

    # the compaction's own process dies (SIGSEGV, as DuckLake's crash does): the caller runs it again
    proc = _compacting(settings, tmp_path)
    try:
        child = _building(settings, proc)
        assert child != proc.pid  # the compaction runs in a process of its own
        os.kill(child, signal.SIGSEGV)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert "its process died (SIGSEGV)" in err and f":{child}:" in err  # run again; the dead claim taken over
    assert f"holds {len(acknowledged)} memories" in out, out
    assert _head(settings)[0] is None  # given back

    # killed with its caller (the whole process group): nothing runs it again
    _write(settings, acknowledged, "n")
    proc = _compacting(settings, tmp_path)
    try:
        child = _building(settings, proc)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()  # reaped, as a worker's parent reaps its pool process
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while not gone(child):  # the compaction's process reaped by init, as an orphan is
        assert time.monotonic() < deadline, f"the compaction's process {child} outlived the kill"
        time.sleep(0.05)
    holder, _ = _head(settings)
    assert holder is not None and holder.split(":")[1] == str(child), "killed while it held the claim"
    index = settings.lake_index_path
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
