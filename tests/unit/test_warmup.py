"""What a worker loads before it consumes (resources.current().warm), the ready line it
logs (workers/warmup.py), and that a forked pool process starts without its
parent's DuckDB connection."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

from tests.conftest import write_jsonl
from workers import resources, warmup
from workers.cli.common import ingest_file


def test_each_queue_loads_what_its_tasks_use(embedded, tmp_path):
    written = ingest_file(write_jsonl(tmp_path / "m.jsonl", [{"id": f"m{i}", "namespace": "a", "content": f"memory {i}"}
                                                             for i in range(5)]), embedded, progress=False)
    loaded = dict(resources.current().warm(["embed", "search", "audit"]))
    assert set(loaded) == {"query embedder hash-64 (64-d)", "the descent's compiled loops",
                           f"store version {written.version} with its vector index (5 memories) and full-text "
                           "postings (0.0 MiB) and its graph",
                           "DuckDB's parameter binding"}
    assert resources.current().snapshot().postings() is not None  # loaded, held for the first query
    assert resources.current().snapshot().graph_part() is not None
    assert all(seconds >= 0 for seconds in loaded.values())
    assert [what for what, _ in resources.current().warm(["audit"])] == ["DuckDB's parameter binding"]
    assert resources.current().warm(["other"]) == []


def test_search_before_any_store_says_so(embedded):
    (kernels, _), (what, _) = resources.current().warm(["search"])
    assert kernels == "the descent's compiled loops"
    assert what.startswith("no store in ") and "yet" in what


def test_the_ready_line_names_queues_and_what_was_loaded():
    reports = [{"pid": 1, "loaded": [["query embedder m (8-d)", 0.4]]},
               {"pid": 2, "loaded": [["query embedder m (8-d)", 0.7]]}]
    level, line = warmup._describe("w@h", ("embed",), 2, reports, 300)
    assert level == logging.INFO
    assert line == "w@h ready: queues embed; 2 processes loaded query embedder m (8-d) in 0.7 s"
    level, line = warmup._describe("w@h", ("audit",), 1, [{"pid": 1, "loaded": []}], 300)
    assert line == "w@h ready: queues audit; 1 process, nothing to load"


def test_a_failed_or_late_process_makes_the_ready_line_a_warning():
    reports = [{"pid": 1, "error": "StoreError: the store is newer"}]
    level, line = warmup._describe("w@h", ("search",), 2, reports, 300)
    assert level == logging.WARNING
    assert "1 could not load (StoreError: the store is newer)" in line
    assert "1 not loaded within 300 s (DIMPLE_WORKER_WARMUP_TIMEOUT_S)" in line


def test_reports_are_read_until_every_process_answered_or_the_timeout():
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b'{"pid": 1, "loaded": []}\n')
        assert warmup._read_reports(read_fd, 1, timeout=5) == [{"pid": 1, "loaded": []}]
        assert warmup._read_reports(read_fd, 1, timeout=0.2) == []  # nobody else reports
    finally:
        os.close(read_fd)
        os.close(write_fd)


# A forked child holds none of its parent's store connections and opens its
# own. DuckDB is not fork-safe (its extensions' state is the parent's), so a
# worker's main process still never opens the store: its pool processes do,
# after the fork (``worker_process_init``).
def test_a_forked_child_does_not_inherit_the_store_connection(embedded, tmp_path):
    ingest_file(write_jsonl(tmp_path / "m.jsonl", [{"id": "m1", "namespace": "a", "content": "one"}]),
                embedded, progress=False)
    parent_store = resources.current().store()
    assert parent_store is not None
    pid = os.fork()
    if pid == 0:  # the child: its own connection, never the parent's
        code = 0 if resources.current()._reader is None and resources.current().store() is not parent_store else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert resources.current().store() is parent_store  # the parent's is untouched


def test_an_ingest_worker_loads_the_query_embedder_and_a_big_batch_the_bulk_one(embedded, monkeypatch):
    """Agents write a memory at a time: the ingest queue warms the query
    embedder (no torch to import), and only a write of more than one batch
    of new texts loads the bulk embedder, once."""
    from pipeline.embedders import HashEmbedder
    from workers.api import remember

    made = []

    def make(settings, bulk=False):
        made.append(bulk)
        return HashEmbedder(64)

    monkeypatch.setattr(resources.current(), "_embedders", {})
    monkeypatch.setattr(resources, "make_embedder", make)
    assert [what for what, _ in resources.current().warm(["ingest"])] == ["query embedder hash-64 (64-d)",
                                                                "DuckDB's parameter binding"]
    batch = embedded.embed_batch_size
    remember([{"id": "one", "namespace": "a", "content": "a single memory"}])
    remember([{"id": f"b{i}", "namespace": "a", "content": f"memory {i}"} for i in range(batch)])
    assert made == [False]  # up to a batch: the query embedder, loaded at warm-up
    remember([{"id": f"c{i}", "namespace": "a", "content": f"memory {i}"} for i in range(batch + 1)])
    remember([{"id": f"d{i}", "namespace": "a", "content": f"memory {i}"} for i in range(batch + 1)])
    assert made == [False, True]  # more: the bulk embedder, loaded once and kept


def test_the_first_bound_duckdb_parameter_is_paid_at_warm_up():
    """DuckDB imports pandas (when installed) at a process's first bound
    parameter: a worker that writes pays it before its ready line."""
    import subprocess
    import sys

    code = ("import sys; from workers import resources; assert 'pandas' not in sys.modules; "
            "resources.current().warm(['audit']); print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_the_worker_own_process_closes_the_startup_pipe_once(monkeypatch):
    """Celery's solo pool sends ``worker_process_init`` in the worker's own
    process, which the step loads itself. The handler closed the pipe there and
    the step closed the same two numbers again: by then another file's (in a
    real worker a broker connection's, whose consumer then read another
    connection's replies and died)."""
    monkeypatch.setattr(warmup, "_STARTUP", warmup._Startup())
    loads = []
    monkeypatch.setattr(warmup, "_load", lambda queues: loads.append(queues) or {"pid": os.getpid(), "loaded": []})
    worker = SimpleNamespace(app=SimpleNamespace(amqp=SimpleNamespace(queues=SimpleNamespace(consume_from=["ingest"]))),
                             pool=object(), hostname="w@h")  # a pool that runs tasks in this process
    step = warmup.WarmUp(worker)
    warmup._warm_pool_process()  # what the solo pool sends, in this process
    other = os.open(os.devnull, os.O_RDONLY)  # the lowest free number: one of the pipe's, had it been closed
    try:
        step.start(worker)
        os.fstat(other)  # still open: the step closed the pipe, nothing else
    finally:
        os.close(other)
    assert loads == [("ingest",)]  # loaded once, by the step
    assert warmup._STARTUP.ready == (logging.INFO, "w@h ready: queues ingest; 1 process, nothing to load")


def test_a_worker_process_does_its_matrix_products_on_the_blas_threads_it_is_given(embedded):
    import numpy  # noqa: F401  (the BLAS threadpoolctl sees is the one numpy loaded)
    from threadpoolctl import threadpool_info, threadpool_limits

    import workers

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    with threadpool_limits(limits=2, user_api="blas"):  # as a 2-core host starts it; restored on leaving
        assert blas_threads() == {2}
        assert "error" not in warmup._load(())  # a pool process at its start, default settings
        assert blas_threads() == {1}
        workers.configure(embedded.replace(worker_blas_threads=0))
        threadpool_limits(limits=2, user_api="blas")
        warmup._load(())
        assert blas_threads() == {2}  # 0: left at the library's default
