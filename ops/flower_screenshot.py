"""Screenshot of Flower watching the pipeline's tasks, in headless Chromium.

Starts the same stack as the integration tests (redis-server on a free
loopback port, one worker per queue, Flower with basic auth), builds the demo
store, answers the demo query set through the broker, then renders Flower's
task list and writes a PNG:

    python -m ops.flower_screenshot --out flower-tasks.png
    python -m ops.flower_screenshot --out docs/flower-tasks.png --force   # the README's picture

Needs Chromium (Debian: apt-get install -y chromium). Everything stays on
loopback; the stack is stopped afterwards and its temporary folder removed
(``--run-dir`` keeps logs and the demo store where you say). An existing
``--out`` is kept unless ``--force``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ops.stack import Stack, free_port

USER, PASSWORD = "ops", "screenshot-only"  # a throwaway Flower on loopback


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise SystemExit("Chromium not found; install it (Debian/Ubuntu: apt-get install -y chromium)")


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f}s")


def screenshot(url: str, out: Path, size: str = "1600,1000") -> None:
    """Render ``url`` in headless Chromium to a PNG at ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
             f"--window-size={size}", "--virtual-time-budget=8000", f"--screenshot={out.resolve()}", url],
            check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    if not out.exists() or out.stat().st_size == 0:
        raise RuntimeError(f"Chromium wrote no screenshot to {out}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ops.flower_screenshot",
        description="Start redis-server, one worker per queue and Flower on loopback, answer demo queries "
                    "through the broker, and save Flower's task list as a PNG (headless Chromium).")
    p.add_argument("--out", type=Path, default=Path("flower-tasks.png"),
                   help="the PNG to write (default: %(default)s; the README's is docs/flower-tasks.png)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="keep the stack's logs, pid files and demo store here (default: a temporary folder, "
                        "removed afterwards)")
    p.add_argument("--queries", type=int, default=25, help="demo queries to send through the broker (default: 25)")
    args = p.parse_args(argv)
    if args.out.exists() and not args.force:
        p.error(f"--out: {args.out} exists (give --force to overwrite it)")
    if args.queries < 1:
        p.error("--queries: at least 1")
    chromium_binary()
    temporary = args.run_dir is None
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="dimple-flower-"))
    try:
        return _run(args, run_dir)
    finally:
        if temporary:
            shutil.rmtree(run_dir, ignore_errors=True)


def _run(args: argparse.Namespace, run_dir: Path) -> int:
    import workers
    from workers.api import search, search_many
    from workers.app import app, reconfigure
    from workers.cli.demo import build_demo_store, demo_settings, load_queries
    from workers.settings import WorkerSettings

    settings = demo_settings(WorkerSettings(data_dir=run_dir / "data"))
    files = build_demo_store(settings)
    queries, _ = load_queries(files)

    stack = Stack(run_dir / "stack")
    flower = None
    try:
        stack.start_redis()
        env = {"DIMPLE_DATA_DIR": str(settings.data_dir)}
        for queue in ("embed", "search", "audit", "ingest"):
            stack.start_worker(f"w-{queue}", queue, concurrency=2 if queue == "search" else 1, env=env)
        reconfigure(settings.replace(broker_url=stack.broker_url))
        stack.wait_for_workers(app, ["w-embed", "w-search", "w-audit", "w-ingest"], timeout=120)

        port = free_port()
        flower = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "flower"],
            env=stack.env({"DIMPLE_DATA_DIR": str(settings.data_dir), "DIMPLE_FLOWER_USER": USER,
                           "DIMPLE_FLOWER_PASSWORD": PASSWORD, "DIMPLE_FLOWER_PORT": str(port)}),
            stdout=open(stack.run_dir / "flower.log", "ab"), stderr=subprocess.STDOUT,
        )
        wait_http(f"http://127.0.0.1:{port}/healthcheck")
        time.sleep(2)  # Flower subscribes to worker events before the queries run

        workers.configure(settings.replace(broker_url=stack.broker_url))
        batch = [q["text"] for q in queries[: args.queries]]
        for text in batch[:5]:
            search(text)  # a few single queries: one canvas each
        search_many(batch, batch_size=10)  # and a batched replay
        time.sleep(2)  # the last task events reach Flower

        screenshot(f"http://{USER}:{PASSWORD}@127.0.0.1:{port}/tasks", args.out)
        kept = f"; stack logs in {stack.run_dir}" if args.run_dir is not None else ""
        print(f"wrote {args.out} ({args.out.stat().st_size} bytes){kept}")
    finally:
        if flower is not None:
            flower.terminate()
            flower.wait(10)
        stack.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
