"""Start and stop a local dimple stack without Docker: redis-server and Celery
workers per queue, with pid files and logs under one run directory.

Used by the integration tests; operators can use it too:

    python -m ops.stack start --run-dir /tmp/dimple-stack --queues embed,search
    python -m ops.stack stop --run-dir /tmp/dimple-stack
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.processes import gone


def children(pid: int) -> list[int]:
    """The process ids of ``pid``'s children (Linux ``/proc``; none once it has exited)."""
    try:
        return [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_binary() -> str:
    path = shutil.which("redis-server")
    if not path:
        raise RuntimeError(
            "redis-server not found; install it (Debian/Ubuntu: apt-get install -y redis-server; "
            "macOS: brew install redis)"
        )
    return path


@dataclass
class Stack:
    run_dir: Path
    port: int = 0
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    log_start: dict[str, int] = field(default_factory=dict)  # a worker's log size when it was started
    # Where redis-server listens and workers reach it: loopback, or (several
    # hosts, tests/hosts.py) an address every host's network reaches.
    host: str = "127.0.0.1"
    # A command the workers run under, e.g. ``ip netns exec host1`` (another host's network).
    wrap: tuple[str, ...] = ()
    # redis-server's password (``--requirepass``; reaches workers as DIMPLE_BROKER_PASSWORD):
    # Redis refuses clients off loopback without one (its protected mode).
    password: str = ""

    @property
    def broker_url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        # a password in the shell is not for this stack's redis-server (its own, if any, is set below)
        env = {k: v for k, v in os.environ.items() if k != "DIMPLE_BROKER_PASSWORD"}
        env.update({"DIMPLE_BROKER_URL": self.broker_url, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        if self.password:
            env["DIMPLE_BROKER_PASSWORD"] = self.password
        env.update(extra or {})
        return env

    def start_redis(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        log = open(self.run_dir / "redis.log", "ab")
        self.procs["redis"] = subprocess.Popen(
            [redis_binary(), "--port", str(self.port), "--bind", self.host, "--save", "",
             "--appendonly", "no", "--maxmemory-policy", "noeviction", "--dir", str(self.run_dir),
             *(["--requirepass", self.password] if self.password else [])],
            stdout=log, stderr=subprocess.STDOUT,
        )
        self._write_pid("redis")
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                    if self.password:
                        s.sendall(f"AUTH {self.password}\r\n".encode())
                        s.recv(16)
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on port {self.port}; see {self.run_dir / 'redis.log'}")

    def start_worker(self, name: str, queues: str, concurrency: int = 1, env: dict[str, str] | None = None,
                     pool: str | None = None) -> None:
        """A ``celery worker`` taking ``queues`` (``pool``: its ``-P``, e.g. ``solo``; unset, celery's default, prefork)."""
        log = self.run_dir / f"{name}.log"
        self.log_start[name] = log.stat().st_size if log.exists() else 0
        self.procs[name] = subprocess.Popen(
            [*self.wrap, sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-Q", queues,
             "-c", str(concurrency), *(["-P", pool] if pool else []), "-n", f"{name}@%h", "--without-gossip",
             "--without-mingle", "--loglevel", "INFO", "-E", "--logfile", str(log)],
            env=self.env(env), stdout=subprocess.DEVNULL, stderr=open(self.run_dir / f"{name}.err", "ab"),
            start_new_session=True,
        )
        self._write_pid(name)

    def start_cli_worker(self, name: str, queues: str, concurrency: int = 1, env: dict[str, str] | None = None) -> None:
        """A worker started the way ``dimple worker`` starts one; its output goes to ``NAME.log``."""
        path = self.run_dir / f"{name}.log"
        self.log_start[name] = path.stat().st_size if path.exists() else 0  # an earlier run's lines stay above
        log = open(path, "ab")
        self.procs[name] = subprocess.Popen(
            [*self.wrap, sys.executable, "-m", "workers.cli", "worker", "--queues", queues,
             "--concurrency", str(concurrency), "--name", f"{name}@%h"],
            env=self.env(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self._write_pid(name)

    def wait_for_ready(self, name: str, timeout: float = 120.0) -> str:
        """Block until worker ``name`` logs its ready line (``workers/warmup.py``); return the line."""
        log = self.run_dir / f"{name}.log"
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = ""
            if log.exists():
                with open(log, "rb") as f:
                    f.seek(self.log_start.get(name, 0))  # this start's lines only
                    text = f.read().decode(errors="replace")
            for line in text.splitlines():
                if f"{name}@" in line and " ready: " in line:
                    return line
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"worker {name} exited with {proc.returncode}; see {log}")
            time.sleep(0.05)
        raise RuntimeError(f"worker {name} logged no ready line within {timeout}s; see {log}")

    def start_query_workers(self, app, prefix: str, env: dict[str, str], *, audit: bool = False,
                            timeout: float = 120.0) -> list[str]:
        """An embed worker and a search worker with 2 processes (and an audit
        worker with ``audit``), named ``{prefix}-embed`` and so on; returns
        once every one answers a ping through ``app`` (configured for this
        stack's broker beforehand)."""
        names = [f"{prefix}-embed", f"{prefix}-search"] + ([f"{prefix}-audit"] if audit else [])
        self.start_worker(names[0], "embed", env=env)
        self.start_worker(names[1], "search", concurrency=2, env=env)
        if audit:
            self.start_worker(names[2], "audit", env=env)
        self.wait_for_workers(app, names, timeout=timeout)
        return names

    def wait_for_workers(self, app, names: list[str], timeout: float = 60.0) -> None:
        """Block until every named worker answers a ping."""
        deadline = time.time() + timeout
        wanted = set(names)
        while time.time() < deadline:
            for name, proc in self.procs.items():
                if name in wanted and proc.poll() is not None:
                    raise RuntimeError(f"worker {name} exited with {proc.returncode}; see {self.run_dir}/{name}.log")
            replies = app.control.ping(timeout=1.0) or []
            seen = {next(iter(r)).split("@")[0] for r in replies}
            if wanted <= seen:
                return
        raise RuntimeError(f"workers {sorted(wanted)} did not come up within {timeout}s")

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig) if name != "redis" else proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL) if name != "redis" else proc.kill()
                proc.wait(5)
        (self.run_dir / f"{name}.pid").unlink(missing_ok=True)

    def stop_all(self) -> None:
        for name in [n for n in self.procs if n != "redis"]:
            self.stop(name)
        self.stop("redis")

    def _write_pid(self, name: str) -> None:
        (self.run_dir / f"{name}.pid").write_text(str(self.procs[name].pid))


QUEUES = ("embed", "search", "audit", "ingest")  # workers.app's queues: every one by default
DEFAULT_PORT = 16379  # stable across runs, and clear of a system redis-server on 6379
ENV_FILE = "env"  # in the run dir: `source RUN_DIR/env` sets DIMPLE_BROKER_URL


def _running(run_dir: Path) -> list[str]:
    """The names of this run dir's processes that are still alive (by their pid files)."""
    out = []
    for pidfile in sorted(run_dir.glob("*.pid")):
        try:
            if not gone(int(pidfile.read_text())):
                out.append(pidfile.stem)
        except (OSError, ValueError):
            continue
    return out


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _stop_from_pidfiles(run_dir: Path) -> None:
    stopped = False
    for pidfile in sorted(run_dir.glob("*.pid"), key=lambda p: p.stem == "redis"):
        pid = int(pidfile.read_text())
        try:
            os.killpg(pid, signal.SIGTERM) if pidfile.stem != "redis" else os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        pidfile.unlink(missing_ok=True)
        stopped = True
        print(f"stopped {pidfile.stem} ({pid})")
    (run_dir / ENV_FILE).unlink(missing_ok=True)
    if not stopped:
        print(f"nothing to stop in {run_dir}")


def _queues(text: str) -> list[str]:
    names = [q.strip() for q in text.split(",") if q.strip()]
    unknown = [q for q in names if q not in QUEUES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown) or 'none given'} not a queue (choose from {', '.join(QUEUES)})")
    return list(dict.fromkeys(names))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ops.stack",
        description="Start or stop redis-server and one `dimple worker` per queue on loopback, without Docker "
                    "(pid files, logs and an env file in the run dir). Workers use the DIMPLE_* settings of "
                    "this shell (DIMPLE_DATA_DIR: the store they serve).")
    p.add_argument("action", choices=["start", "stop"], help="start the stack, or stop the one in --run-dir")
    p.add_argument("--run-dir", type=Path, default=Path("/tmp/dimple-stack"),
                   help="where pid files, logs and the env file go (default: %(default)s)")
    p.add_argument("--port", type=int, default=None,
                   help=f"redis-server's loopback port (default: {DEFAULT_PORT}, or a free one if that is taken)")
    p.add_argument("--queues", type=_queues, default=list(QUEUES),
                   help=f"comma list of queues, one worker each (default: all of {','.join(QUEUES)})")
    p.add_argument("--no-wait", action="store_true",
                   help="return once the processes are started, without waiting for the workers' ready lines")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds to wait for every worker's ready line (default: %(default)s)")
    args = p.parse_args(argv)
    if args.action == "stop":
        _stop_from_pidfiles(args.run_dir)
        return 0
    if args.port is not None and not 0 < args.port < 65536:
        p.error(f"--port: {args.port} is not a port (1-65535)")
    running = _running(args.run_dir) if args.run_dir.is_dir() else []
    if running:
        print(f"a stack is already running in {args.run_dir} ({', '.join(running)}): "
              f"python -m ops.stack stop --run-dir {args.run_dir}", file=sys.stderr)
        return 2
    port = args.port
    if port is None:
        port = DEFAULT_PORT if _port_free(DEFAULT_PORT) else free_port()
        if port != DEFAULT_PORT:
            print(f"port {DEFAULT_PORT} is taken: redis-server listens on {port}")
    elif not _port_free(port):
        print(f"--port: {port} is in use on 127.0.0.1", file=sys.stderr)
        return 2
    stack = Stack(args.run_dir, port)
    try:
        stack.start_redis()
        names = []
        for queue in args.queues:
            # ingest: writes and a background compaction side by side (ops/RUNBOOK.md);
            # started as `dimple worker`, which starts its worker again when it dies
            name = f"w-{queue}"
            stack.start_cli_worker(name, queue, concurrency=2 if queue == "ingest" else 1)
            names.append(name)
        env_file = args.run_dir / ENV_FILE
        env_file.write_text(f"export DIMPLE_BROKER_URL={stack.broker_url}\n")
        if not args.no_wait:
            print(f"waiting for {len(names)} worker(s) to load what their queues need ...", flush=True)
            for name in names:
                line = stack.wait_for_ready(name, timeout=args.timeout)
                print(f"{name} ready: {line.split(' ready: ', 1)[-1]}", flush=True)
    except (RuntimeError, OSError) as exc:
        stack.stop_all()
        print(f"ops.stack: {exc}", file=sys.stderr)
        return 1
    print(f"broker {stack.broker_url}; logs and pid files in {args.run_dir}"
          + ("" if not args.no_wait else " (workers still starting: their ready lines go to the logs)"))
    print(f"export DIMPLE_BROKER_URL={stack.broker_url}   # or: source {env_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
