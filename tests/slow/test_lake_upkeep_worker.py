"""A forget on the lake is erased within ``store.erase_within`` (the default,
an hour) even when nothing is written after it: a real ``ingest`` worker's
pool process asks the catalog once a minute (``workers/upkeep.py``) and sends
``ingest.compact`` when an erase is due; so does a worker whose pool runs
tasks in its own process: ``--pool solo`` (celery's solo pool sends
``worker_process_init`` in that process) and ``--pool threads`` (which sends
none: the check starts on ``worker_ready``). Slow: it waits for that minute."""

from __future__ import annotations

import time

import pytest

from ops.stack import Stack, redis_binary
from pipeline.store.lake import Lake
from pipeline.store.writes import parse_records, write
from tests.conftest import store_settings
from tests.lakes import age_forgets, files_holding, pass_the_wait

pytestmark = pytest.mark.integration

SECRET = "ZQX vault code 7341"


POOLS = {"prefork": None, "solo": "solo", "threads": "threads"}


def test_an_ingest_worker_erases_a_due_forget_with_no_write_after_it_in_each_pool(tmp_path):
    """One store, broker and ingest worker per pool, all at once (each waits
    out its first check, a minute after it starts)."""
    redis_binary()  # a clear message when redis-server is missing
    stores = {name: store_settings(tmp_path / name) for name in POOLS}
    for settings in stores.values():
        write(settings, parse_records([{"id": "s1", "namespace": "n", "content": SECRET}]
                                      + [{"id": f"k{i}", "namespace": "n", "content": f"keep note {i}"}
                                         for i in range(5)], settings))
        write(settings, forget=["s1"])
        age_forgets(settings)  # as if forgotten an hour ago (the default store.erase_within)
        assert files_holding(SECRET.encode(), settings.data_dir), "the forget alone does not erase"

    runs = {name: Stack(tmp_path / name / "stack") for name in POOLS}
    try:
        for name, run in runs.items():
            run.start_redis()
            run.start_worker("w-ingest", "ingest", env={
                "DIMPLE_DATA_DIR": str(stores[name].data_dir), "DIMPLE_EMBEDDING_MODEL": "hash-64",
                "DIMPLE_STORE__ENGINE": "lake", "DIMPLE_AUDIT_ENABLED": "false"}, pool=POOLS[name])
        # the first check a minute after the pool process (prefork) or the worker (solo, threads) starts
        deadline = time.monotonic() + 240
        waiting = set(POOLS)
        while waiting:
            for name in sorted(waiting):
                # done once the files are gone and the erase is marked (``mark_erased``
                # commits after the old bases are dropped: a moment after the files go)
                if not files_holding(SECRET.encode(), stores[name].data_dir) and not forgets_left(stores[name]):
                    waiting.discard(name)
                else:
                    pass_the_wait(stores[name])  # a DuckLake crash left files its erase waits for: the next check
            if not waiting:
                break
            assert time.monotonic() < deadline, "".join(
                f"\nthe {name} pool's worker did not erase the due forget; its log ends:\n"
                + _tail(runs[name].run_dir / "w-ingest.log") for name in sorted(waiting))
            time.sleep(2)
    finally:
        for run in runs.values():
            run.stop_all()
    for settings in stores.values():
        with Lake.open(settings) as lake:
            assert lake.con.execute("SELECT count(*) FROM forgets").fetchone() == (0,)
            assert sorted(m.id for m in lake.read()) == [f"k{i}" for i in range(5)]


def forgets_left(settings) -> int:
    with Lake.open(settings) as lake:
        return lake.con.execute("SELECT count(*) FROM forgets").fetchone()[0]


def _tail(path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else f"({path} missing)"
