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


@pytest.mark.parametrize("pool", [None, "solo", "threads"], ids=["prefork", "solo", "threads"])
def test_an_ingest_worker_erases_a_due_forget_with_no_write_after_it(tmp_path, pool):
    redis_binary()  # a clear message when redis-server is missing
    settings = store_settings(tmp_path)
    write(settings, parse_records([{"id": "s1", "namespace": "n", "content": SECRET}]
                                  + [{"id": f"k{i}", "namespace": "n", "content": f"keep note {i}"} for i in range(5)],
                                  settings))
    write(settings, forget=["s1"])
    age_forgets(settings)  # as if forgotten an hour ago (the default store.erase_within)
    assert files_holding(SECRET.encode(), settings.data_dir), "the forget alone does not erase"

    run = Stack(tmp_path / "stack")
    run.start_redis()
    try:
        run.start_worker("w-ingest", "ingest", env={
            "DIMPLE_DATA_DIR": str(settings.data_dir), "DIMPLE_EMBEDDING_MODEL": "hash-64",
            "DIMPLE_STORE__ENGINE": "lake", "DIMPLE_AUDIT_ENABLED": "false"}, pool=pool)
        # the first check a minute after the pool process (prefork) or the worker (solo, threads) starts
        deadline = time.monotonic() + 240
        while files_holding(SECRET.encode(), settings.data_dir):
            assert time.monotonic() < deadline, ("the worker did not erase the due forget; its log ends:\n"
                                                 + _tail(run.run_dir / "w-ingest.log"))
            pass_the_wait(settings)  # a DuckLake crash left files its erase waits for: the next check erases
            time.sleep(2)
    finally:
        run.stop_all()
    with Lake.open(settings) as lake:
        assert lake.con.execute("SELECT count(*) FROM forgets").fetchone() == (0,)
        assert sorted(m.id for m in lake.read()) == [f"k{i}" for i in range(5)]


def _tail(path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else f"({path} missing)"
