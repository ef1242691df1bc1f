"""``python -m ops.stack``, as the README runs it: every queue by default, back
only once the workers are ready, a broker URL to source, and writes served."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.stack import QUEUES, _running, free_port, redis_binary
from pipeline.processes import gone

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow  # every queue's worker started and stopped: ~13 s
def test_stack_start_serves_every_queue_and_stops(tmp_path):
    redis_binary()
    run_dir = tmp_path / "stack"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIMPLE_")}
    env.update({"DIMPLE_DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1"})
    port = free_port()
    started = _run(["-m", "ops.stack", "start", "--run-dir", str(run_dir), "--port", str(port)], env)
    try:
        assert started.returncode == 0, started.stderr
        # back only once every queue's worker logged its ready line
        for queue in QUEUES:
            assert f"w-{queue} ready: queues {queue}" in started.stdout
        env_line = (run_dir / "env").read_text().strip()
        assert env_line == f"export DIMPLE_BROKER_URL=redis://127.0.0.1:{port}/0"
        assert env_line in started.stdout
        # a second start on the same run dir is refused, naming the stop command
        again = _run(["-m", "ops.stack", "start", "--run-dir", str(run_dir)], env)
        assert again.returncode == 2 and "ops.stack stop" in again.stderr
        # a write through the stack is served (an ingest worker is there) and read back
        broker_env = {**env, "DIMPLE_BROKER_URL": env_line.split("=", 1)[1]}
        script = ("from workers.api import remember, search; "
                  "w = remember({'id': 'stack-1', 'namespace': 'code', 'content': 'the stack serves writes'}); "
                  "print(w.ids, search('stack serves writes', mode='keyword').results[0].id)")
        wrote = _run(["-c", script], broker_env, timeout=120)
        assert wrote.returncode == 0, wrote.stderr
        assert wrote.stdout.split() == ["['stack-1']", "stack-1"]
    finally:
        pids = [int(p.read_text()) for p in run_dir.glob("*.pid")]
        stopped = _run(["-m", "ops.stack", "stop", "--run-dir", str(run_dir)], env)
    assert stopped.returncode == 0
    assert len(pids) == len(QUEUES) + 1  # redis-server and a worker per queue
    deadline = time.monotonic() + 30
    while any(not gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if not gone(pid)]
    assert _running(run_dir) == [] and not (run_dir / "env").exists()


def test_stack_refuses_unknown_queue(tmp_path):
    out = _run(["-m", "ops.stack", "start", "--run-dir", str(tmp_path), "--queues", "embed,bogus"],
               dict(os.environ))
    assert out.returncode == 2
    assert "bogus not a queue" in out.stderr and "ingest" in out.stderr
    assert not list(tmp_path.glob("*.pid"))


def test_a_ready_line_from_an_earlier_start_does_not_count(tmp_path):
    """``stop`` keeps the logs; a second ``start`` in the same run dir waits
    for this start's ready lines, not the last run's."""
    from ops.stack import Stack

    stack = Stack(tmp_path)
    (tmp_path / "w-old.log").write_text("INFO dimple.worker w-old@host ready: queues embed; an earlier run\n")
    stack.procs["w-old"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    stack.log_start["w-old"] = (tmp_path / "w-old.log").stat().st_size
    try:
        with pytest.raises(RuntimeError, match="logged no ready line within 1"):
            stack.wait_for_ready("w-old", timeout=1)
        with open(tmp_path / "w-old.log", "a") as log:
            log.write("INFO dimple.worker w-old@host ready: queues embed; this run\n")
        assert stack.wait_for_ready("w-old", timeout=5).endswith("this run")
    finally:
        stack.procs.pop("w-old").kill()
