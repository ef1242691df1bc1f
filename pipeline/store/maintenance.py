"""The store's compaction (``pipeline.store.lake.compaction``: flush, merge,
expire or erase, a base at the latest snapshot): what ``dimple compact``,
``dimple reindex``, ``ingest.compact`` and a write past a threshold run.

Apart from the lake's modules: they build their bases with
``pipeline.store.compact.fresh_base``, so ``compact`` cannot live there.

A compaction runs in a child process of its own (``python -m
pipeline.store.maintenance``: the request on stdin, the report on stdout).
DuckLake's maintenance calls (``ducklake_flush_inlined_data``,
``ducklake_merge_adjacent_files``, ``ducklake_rewrite_data_files``) have died
now and then with a corrupted heap or a segmentation fault (docs/LAKE.md,
"Compaction in a process of its own"); in the caller's process such a death
would take down an ingest worker with its tasks, or an agent's own embedded
process. A child that dies by a signal leaves the lake as a killed
compaction does (nothing half-committed; its claim taken over at once, its
process being gone) and is run again, ``TRIES`` times in all.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import subprocess
import sys
from typing import Any

from pipeline import errors
from pipeline.settings import Settings
from pipeline.store.compact import CompactReport
from pipeline.store.lake.compaction import compact_lake

log = logging.getLogger("dimple.lake")

TRIES = 3


def compact(settings: Settings, *, rebuild: bool = False, wait: bool = False, erase: bool = False) -> CompactReport:
    """Compact the lake ``settings`` name (``rebuild``: every namespace
    clustered again; without ``wait``, ``ran`` False at once when another
    compaction runs; ``erase``: every forget waiting erased now, due or not),
    in a child process; an error of dimple's raised there is raised here as itself."""
    request = json.dumps({"settings": settings.model_dump(mode="json"), "rebuild": rebuild, "wait": wait,
                          "erase": erase,
                          "log_level": logging.getLogger("dimple").getEffectiveLevel()})
    for attempt in range(1, TRIES + 1):
        # stderr is this process's: the child's log lines (and a crash's trace) land where this one's do
        done = subprocess.run([sys.executable, "-m", "pipeline.store.maintenance"], input=request,
                              stdout=subprocess.PIPE, text=True, check=False)
        if done.returncode >= 0:
            return _answer(done.returncode, done.stdout)
        how = _signal_name(-done.returncode)
        if attempt < TRIES:
            log.warning("compaction: its process died (%s), a known DuckLake crash in its maintenance calls; "
                        "running it again (%d of %d)", how, attempt + 1, TRIES)
    raise errors.StoreError(f"compaction: its process died ({how}) each of {TRIES} times; the lake is as a killed "
                            "compaction leaves it (nothing half-committed): run `dimple compact` again")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _answer(returncode: int, stdout: str) -> CompactReport:
    """The child's report, or its error raised as itself (``errors``' class by name)."""
    try:
        answer = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise errors.StoreError(f"compaction: its process exited with code {returncode} and no report "
                                "(its log above says why)") from None
    if "report" in answer:
        return CompactReport(**answer["report"])
    cls = getattr(errors, answer["type"], None)
    if not (isinstance(cls, type) and issubclass(cls, errors.DimpleError)):
        raise errors.StoreError(f"compaction failed: {answer['message']}")
    if answer["args"] is None:  # an error of dimple's built from more than text: its text, as a StoreError
        raise errors.StoreError(answer["message"])
    raise cls(*answer["args"])


def _child(request: dict[str, Any]) -> dict[str, Any]:
    settings = Settings.model_validate(request["settings"])  # as sent: no environment or .env read here
    try:
        report = compact_lake(settings, wait=request["wait"], rebuild=request["rebuild"], erase=request["erase"])
    except errors.DimpleError as exc:
        plain = all(a is None or isinstance(a, str | int | float | bool) for a in exc.args)
        return {"type": type(exc).__name__, "args": list(exc.args) if plain else None, "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - its trace to the log, its text to the caller
        log.exception("compaction failed")
        return {"type": type(exc).__name__, "args": None, "message": f"{type(exc).__name__}: {exc}"}
    out = report.as_dict()
    out["seconds"] = report.seconds
    return {"report": out}


def main() -> int:
    faulthandler.enable()  # a crash inside DuckDB leaves its Python stack in the log
    request = json.loads(sys.stdin.read())
    logging.basicConfig(level=request["log_level"], stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[compaction]: %(message)s")
    result, sys.stdout = sys.stdout, sys.stderr  # nothing but the answer on stdout
    answer = _child(request)
    result.write(json.dumps(answer) + "\n")
    result.flush()
    return 0 if "report" in answer else 1


if __name__ == "__main__":
    sys.exit(main())
