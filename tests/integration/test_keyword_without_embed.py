"""A keyword query is full text only: through the broker it is answered with
no worker on the ``embed`` queue, while a hybrid query still needs one."""

from __future__ import annotations

import re

import pytest

from ops.stack import Stack
from tests.conftest import store_env

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def search_only(tmp_path_factory, demo_store):
    """redis-server and one search worker: nothing consumes ``embed``."""
    from workers.app import app, reconfigure

    run = Stack(tmp_path_factory.mktemp("search-only"))
    run.start_redis()
    try:
        run.start_worker("w-search-only", "search", env=store_env(demo_store.settings))
        reconfigure(demo_store.with_broker(run.broker_url))
        run.wait_for_workers(app, ["w-search-only"], timeout=120)
        yield run
    finally:
        reconfigure(demo_store.settings)
        run.stop_all()


@pytest.mark.slow  # a worker stack of its own without an embed worker: ~15 s
def test_keyword_query_needs_no_embed_worker(demo_store, search_only):
    import workers
    from pipeline.errors import QueryTimeoutError
    from workers.api import search, search_many

    workers.configure(demo_store.settings)
    embedded = [r.id for r in search("ERR_CONN_RESET", mode="keyword").results]
    workers.configure(demo_store.with_broker(search_only.broker_url).replace(task_timeout_s=5))
    res = search("ERR_CONN_RESET", mode="keyword")
    assert res.mode == "keyword" and [r.id for r in res.results] == embedded != []
    assert [r.id for r in search_many([{"query": "deploy window", "mode": "keyword"}])[0].results]
    with pytest.raises(QueryTimeoutError) as info:
        search("deploy window", mode="hybrid")
    assert re.search(r"no worker is consuming the 'embed' queue", str(info.value))
