"""Flower with basic auth on, watching the pipeline's tasks through worker events."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from ops.stack import free_port

pytestmark = pytest.mark.integration


def _get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_flower_requires_auth_and_shows_every_stage(demo_store, stack, tmp_path):
    import workers
    from workers.api import search

    port = free_port()
    env = dict(os.environ, DIMPLE_BROKER_URL=stack.broker_url, DIMPLE_FLOWER_USER="ops",
               DIMPLE_FLOWER_PASSWORD="s3cret-pw", DIMPLE_FLOWER_PORT=str(port),
               DIMPLE_DATA_DIR=str(demo_store.settings.data_dir))
    log = open(tmp_path / "flower.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "workers.cli", "flower"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if _get(base + "/healthcheck")[0] == 200:
                    break
            except OSError:
                time.sleep(0.3)
        else:
            pytest.fail("Flower did not start: " + (tmp_path / "flower.log").read_text())
        assert _get(base + "/api/workers")[0] == 401
        assert _get(base + "/api/workers", ("ops", "wrong"))[0] == 401
        time.sleep(2)  # let Flower subscribe to events before the queries run
        workers.configure(demo_store.with_broker(stack.broker_url))
        for q in ("ERR_CONN_RESET", "deploy window", "vegetarian restaurants"):
            search(q)
        names: set[str] = set()
        deadline = time.time() + 20
        wanted = {"search.embed", "search.descend", "search.fulltext", "search.fuse",
                  "search.augment", "search.scope", "search.budget", "audit.write"}
        while time.time() < deadline and not wanted <= names:
            status, body = _get(base + "/api/tasks?limit=500", ("ops", "s3cret-pw"))
            assert status == 200
            tasks = json.loads(body)
            names = {t.get("name") for t in tasks.values()}
            time.sleep(0.5)
        assert wanted <= names
        some = next(t for t in tasks.values() if t.get("name") == "search.fuse")
        assert some.get("runtime") is not None and some.get("args")
        assert "s3cret-pw" not in (tmp_path / "flower.log").read_text()
        # Prometheus metrics stay open even with basic auth (documented in the runbook)
        assert _get(base + "/metrics")[0] == 200
    finally:
        proc.terminate()
        proc.wait(10)
        workers.configure(demo_store.settings)


def test_flower_on_a_port_in_use_is_one_line(bare_broker, tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(os.environ, DIMPLE_BROKER_URL=bare_broker.broker_url, DIMPLE_FLOWER_USER="ops",
                   DIMPLE_FLOWER_PASSWORD="s3cret-pw", DIMPLE_FLOWER_PORT=str(port),
                   DIMPLE_DATA_DIR=str(tmp_path))
        out = subprocess.run([sys.executable, "-m", "workers.cli", "flower"], env=env, capture_output=True,
                             text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[-1] == (f"dimple: error: DIMPLE_FLOWER_PORT: 127.0.0.1:{port} is in use (another Flower?): "
                         "stop it, or choose another port"), out.stderr
    assert "Traceback" not in out.stderr
