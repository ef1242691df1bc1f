"""``dimple worker`` keeps its Celery worker running.

The command runs the worker as a child process (``dimple worker
--no-restart ...``, its own process group) and starts it again when it dies
(killed, out of memory, an unrecoverable error): after 1 s, doubling up to
30 s while it keeps dying within a minute of starting. A worker that exits
with status 0 (a warm shutdown it was asked for) is not restarted. SIGTERM,
SIGINT, SIGQUIT and SIGHUP sent to the command are passed on to the worker
and the command ends when it does; if the command itself is killed, the
worker gets SIGTERM (``PR_SET_PDEATHSIG``) and shuts down warm.

While the worker is down, a live worker on the same queue takes over the
messages it held within ``DIMPLE_VISIBILITY_TIMEOUT_S`` (``workers.leases``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence

from billiard.util import set_pdeathsig

log = logging.getLogger("dimple.worker")

RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
STABLE_S = 60.0  # a worker that ran this long counts as healthy: the next restart waits RESTART_FIRST_S again
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def _in_child() -> None:
    """Between fork and exec: a process group of its own (a terminal's Ctrl-C
    reaches the worker once, through this command), and SIGTERM when this command dies."""
    os.setpgid(0, 0)
    try:
        set_pdeathsig(signal.SIGTERM)
    except Exception:  # noqa: BLE001 - not Linux: the worker outlives a killed supervisor
        pass


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def supervise(argv: Sequence[str]) -> int:
    """Run ``argv`` (a worker command) until it exits with status 0 or this
    process is told to stop; restart it whenever it dies. Returns the
    worker's last exit status (128 + signal when killed)."""
    stopping = False
    child: subprocess.Popen | None = None

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    delay = RESTART_FIRST_S
    try:
        while True:
            started = time.monotonic()
            child = subprocess.Popen(list(argv), preexec_fn=_in_child)  # noqa: PLW1509 - no threads here
            code = child.wait()
            if stopping or code == 0:
                return code if code >= 0 else 128 - code
            ran = time.monotonic() - started
            if ran >= STABLE_S:
                delay = RESTART_FIRST_S
            log.error("worker process %s %s after %.0f s; starting it again in %.0f s",
                      child.pid, _how(code), ran, delay)
            until = time.monotonic() + delay
            while not stopping and time.monotonic() < until:
                time.sleep(0.1)
            if stopping:
                return 0
            delay = min(delay * 2, RESTART_MAX_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
