"""The audit trail on the lake through real workers, two "hosts" on one
machine (docs/LAKE.md, "The audit trail on many hosts"): each with its own
data dir (its outbox, its bases), a search worker and an audit worker, over
one lake (a shared catalog and data path) and one Redis. An audit worker may
take the other host's messages; each drains its own outbox; every answered
query has exactly one row in the lake, read from either host."""

from __future__ import annotations

import json
import time

import pytest

from ops.stack import Stack, redis_binary
from pipeline import audit as pa
from pipeline.settings import StoreSettings
from tests.integration.test_audit_workers import _outbox_left
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_two_hosts_write_every_row_once_into_one_lake(tmp_path_factory):
    from pipeline.datasets.demo import write_demo
    from workers.api import search_many
    from workers.app import app, reconfigure
    from workers.cli.common import ingest_file

    redis_binary()
    root = tmp_path_factory.mktemp("audit-hosts")
    a = WorkerSettings(data_dir=root / "a", store=StoreSettings(engine="lake"), _env_file=None)
    files = write_demo(root / "files")
    ingest_file(files["memories"], a, progress=False)  # host a's lake: sqlite:a/lake.sqlite, data path a/lake
    b = a.replace(data_dir=root / "b", store=StoreSettings(engine="lake", catalog=a.lake_catalog,
                                                            data_path=a.lake_data_path))
    hosts = {name: {"DIMPLE_DATA_DIR": str(s.data_dir), "DIMPLE_STORE__ENGINE": "lake",
                    "DIMPLE_STORE__CATALOG": s.lake_catalog, "DIMPLE_STORE__DATA_PATH": str(s.lake_data_path)}
             for name, s in (("a", a), ("b", b))}
    run = Stack(root / "stack")
    run.start_redis()
    try:
        run.start_worker("w-embed", "embed", env=hosts["a"])
        for name, env in hosts.items():
            run.start_worker(f"w-search-{name}", "search", env=env)
            run.start_worker(f"w-audit-{name}", "audit", env=env)
        names = ["w-embed"] + [f"w-{q}-{h}" for h in hosts for q in ("search", "audit")]
        reconfigure(a.replace(broker_url=run.broker_url))
        run.wait_for_workers(app, names, timeout=180)
        queries = [json.loads(line)["text"] for line in files["queries"].read_text(encoding="utf-8").splitlines()
                   if line.strip()]
        results = search_many([{"query": queries[i % len(queries)], "mode": "keyword"} for i in range(200)],
                              batch_size=5)
        asked = {r.query_id for r in results}
        deadline = time.time() + 90
        while True:
            logged = {r.query_id for r in pa.tail(pa.log_of(b), 10_000)}  # read from the other host
            if asked <= logged or time.time() > deadline:
                break
            time.sleep(0.5)
        assert asked - logged == set()
        assert pa.count(pa.log_of(a)) == (len(asked), len(asked))  # never a second row for a query
        # each host's outbox drained: a file goes just after its row commits (the rows
        # above may be read in between), so within a bound, not at the same instant
        assert _outbox_left(a, b) == []
        assert {r.query_profile["store_version"] for r in pa.since(pa.log_of(a))} != set()
    finally:
        reconfigure(a)
        run.stop_all()
        pa.lake.release(pa.log_of(a))
