"""A Redis broker whose password holds URL characters (`@ / : # ? %`): given as
``DIMPLE_BROKER_PASSWORD`` apart from the URL, workers and callers reach it."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from ops.stack import Stack, free_port, redis_binary
from tests.conftest import store_env

pytestmark = pytest.mark.integration
PASSWORD = "p@ss/w:rd#?%20"


@pytest.mark.slow  # a broker and workers of its own: ~7 s
def test_workers_and_callers_reach_a_broker_with_such_a_password(demo_store, tmp_path):
    import workers
    from workers.api import search
    from workers.app import get_app
    from workers.settings import WorkerSettings

    port = free_port()
    redis = subprocess.Popen([redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--requirepass", PASSWORD], stdout=subprocess.DEVNULL)
    stack = Stack(tmp_path, port)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.05)
        url = f"redis://127.0.0.1:{port}/0"
        env = {**store_env(demo_store.settings), "DIMPLE_BROKER_URL": url,
               "DIMPLE_BROKER_PASSWORD": PASSWORD}
        stack.start_cli_worker("pw-search", "embed,search", env=env)
        stack.wait_for_ready("pw-search", timeout=240)
        settings = WorkerSettings.model_validate({**demo_store.settings.model_dump(), "broker_url": url,
                                                  "broker_password": PASSWORD})
        workers.configure(settings)
        assert get_app().conf.broker_url.startswith("redis://:p%40ss%2Fw%3Ard%23%3F%2520@")
        assert search("ERR_CONN_RESET", mode="keyword").results
    finally:
        workers.configure(demo_store.settings)
        stack.stop_all()
        redis.terminate()
        redis.wait(10)
