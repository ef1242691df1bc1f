"""Safe defaults (issue 8): JSON-only messages, Flower behind auth, no secrets in
``dimple config`` or logs, data folders readable by their owner only. (An
unreachable broker's error and log lines without its password:
tests/unit/test_api.py::test_unreachable_broker_is_a_clear_error.)

The tests of this concern for the in-process canvas (the embedded tier); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_safe_defaults.py``.
"""

from __future__ import annotations

import logging
import os

from tests.unit.test_safe_defaults import SECRET, _mode  # noqa: F401  (helpers and fixtures shared with the unit tests)
from workers.cli.commands import worker_argv
from workers.settings import WorkerSettings


def test_worker_arguments_carry_no_secret():
    s = WorkerSettings(_env_file=None, broker_url=f"redis://:{SECRET}@h:6379/0", flower_password=SECRET)
    assert SECRET not in " ".join(worker_argv(s, "search", None, None))


def test_query_log_line_has_no_query_text_or_secret(embedded, caplog, tmp_path):
    """The hybrid.search INFO line carries a hash of the query, not the query."""
    from workers.api import search

    caplog.set_level(logging.INFO, logger="dimple.search")
    search(f"my password is {SECRET}")
    lines = [r.getMessage() for r in caplog.records if r.name == "dimple.search"]
    assert lines and all(SECRET not in line for line in lines)


def test_data_and_audit_folders_are_owner_only_whatever_the_umask(tmp_path):
    """Created 0o700 even under a permissive umask (0o000): memories, audit rows
    (query texts) and dead letters are readable by their owner only."""
    import workers
    from pipeline import audit as audit_rows
    from tests.conftest import write_jsonl
    from workers import audit, resources
    from workers.api import search
    from workers.cli.common import ingest_file

    settings = WorkerSettings(data_dir=tmp_path / "nested" / "data", audit_dir=tmp_path / "audit",
                        embedding_model="hash-64", _env_file=None)
    old = os.umask(0)
    try:
        ingest_file(write_jsonl(tmp_path / "m.jsonl", [{"namespace": "a", "content": "deploy window"}]), settings,
                    progress=False)
        workers.configure(settings)
        res = search("deploy window")
        assert audit.flush(30)
        letter = audit_rows.dead_letter(settings.dead_letter_dir, audit_rows.get(audit_rows.log_of(settings), res.query_id), "test")
    finally:
        os.umask(old)
        resources.current().close_store()
    # the data dir and each folder in it: the lake's data path, bases and host cache
    # (DuckLake makes the folders inside its data path 0o755: the data path's 0o700 keeps them private)
    folders = [settings.data_dir, *(p for p in settings.data_dir.iterdir() if p.is_dir())]
    assert len(folders) > 1
    for folder in (*folders, settings.audit_dir, settings.dead_letter_dir):
        assert _mode(folder) == 0o700, (folder, oct(_mode(folder)))
    assert letter.exists()
