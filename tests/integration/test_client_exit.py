"""A client of the workers exits cleanly: the README's one-liner and ``dimple
search`` through a real broker print their answer and nothing on stderr (no
``Exception ignored in: AsyncResult.__del__`` at interpreter shutdown), and a
long-running client keeps no waiter or result subscription per query."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import store_env

pytestmark = pytest.mark.integration

ONE_LINER = 'from workers.api import search; print(search("deploy window").results[0].id)'


def _run(stack, demo_store, argv: list[str]) -> subprocess.CompletedProcess:
    env = stack.env(store_env(demo_store.settings))
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120)


def test_the_readme_one_liner_prints_the_id_and_nothing_on_stderr(demo_store, stack):
    done = _run(stack, demo_store, ["-c", ONE_LINER])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "code-0200"
    assert done.stderr == ""


def test_dimple_search_through_the_broker_leaves_stderr_empty(demo_store, stack):
    done = _run(stack, demo_store, ["-m", "workers.cli", "search", "deploy window"])
    assert done.returncode == 0, done.stderr
    assert "code-0200" in done.stdout
    assert done.stderr == ""


def test_an_abandoned_handle_does_not_trouble_the_exit(demo_store, stack):
    code = "from workers.api import search_async; search_async('deploy window'); print('sent')"
    done = _run(stack, demo_store, ["-c", code])
    assert done.returncode == 0 and done.stdout.strip() == "sent"
    assert done.stderr == ""


def test_answered_queries_leave_nothing_waiting(demo_store, stack):
    import workers
    from workers.api import search, search_many
    from workers.app import app
    from workers.celery_compat import waiting_on

    workers.configure(demo_store.with_broker(stack.broker_url))
    for _ in range(3):
        search("deploy window")
    search_many(["deploy window", "rollback"] * 3, batch_size=2)
    assert waiting_on(app.backend) == set()
