"""``dimple repoint``: a lake whose folder was moved (a restored backup, a
data dir copied to another host) is refused with one line naming
``store.data_path`` and the command; ``repoint`` records the new path once
every file the catalog lists (of every snapshot still kept) is there, and the
store then answers as before, time travel included. A lake whose files are
not all there is left as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import StoreError
from pipeline.store.lake import Lake
from pipeline.store.lake.repoint import repoint
from tests.conftest import store_settings, use_store
from workers.cli import main

ROOT = Path(__file__).resolve().parents[2]
RECORDS = [{"id": f"m{i}", "namespace": "alpha", "content": f"note {i} about the harbour crane schedule"}
           for i in range(40)]


def _written(tmp_path):
    """A lake of RECORDS (two commits, the second a forget: two snapshots kept), closed: this
    process's store released and its erase check (started by the first write) stopped, as a
    host's processes are before its data dir is moved."""
    import workers
    from workers import resources, upkeep
    from workers.api import forget, remember

    # audit off: a drain thread of this process would log the moved lake's error (with its trace) on its own
    settings = store_settings(tmp_path / "before").replace(audit_enabled=False)
    workers.configure(settings)
    try:
        remember(RECORDS)
        first = remember({"id": "late", "namespace": "alpha", "content": "the harbour crane moved"}).version
        forget("m3")
    finally:
        upkeep.stop()
        resources.current().close_store()
    return settings, first


def _moved(settings, tmp_path):
    after = store_settings(tmp_path / "after")
    after.data_dir.parent.mkdir(parents=True)
    os.rename(settings.data_dir, after.data_dir)  # a move within one file system, as `mv` does it
    return after


def test_a_moved_lake_is_refused_then_repointed_and_answers_as_before(tmp_path, monkeypatch, capsys):
    before, first = _written(tmp_path)
    with Lake.open(before) as lake:
        ids, snapshot = sorted(m.id for m in lake.read()), lake.latest_snapshot()
    after = _moved(before, tmp_path)
    use_store(monkeypatch, after)
    monkeypatch.setenv("DIMPLE_AUDIT_ENABLED", "false")
    import workers
    from workers import resources
    from workers.settings import get_settings

    # refused, as a user's shell sees it (a process of its own: no thread of this one's in its output)
    refused = subprocess.run([sys.executable, "-m", "workers.cli", "search", "harbour crane", "--json"],
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("dimple: error: store.data_path: ") and "dimple repoint" in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stdout == ""
    get_settings.cache_clear()
    workers.configure(get_settings())  # the CLI in this process from here
    assert main(["repoint", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["changed"] and done["checked"] and done["files"] >= 1
    assert done["old"] == f"{before.data_dir / 'lake'}/" and done["new"] == f"{after.data_dir / 'lake'}/"
    with Lake.open(after) as lake:
        assert sorted(m.id for m in lake.read()) == ids and lake.latest_snapshot() == snapshot
        assert "m3" in {m.id for m in lake.read(at=first)}  # an older snapshot's files: there too
    assert main(["search", "harbour crane", "--json", "--top-k", "50"]) == 0
    found = {r["id"] for r in json.loads(capsys.readouterr().out)["results"]}
    assert "late" in found and "m3" not in found
    assert main(["repoint"]) == 0
    assert "already" in capsys.readouterr().out
    resources.current().close_store()
    get_settings.cache_clear()


def test_a_lake_whose_files_are_not_there_is_left_as_it_was(tmp_path):
    before, _ = _written(tmp_path)
    after = store_settings(tmp_path / "after")
    after.data_dir.mkdir(parents=True)
    shutil.copy2(before.data_dir / "lake.sqlite", after.data_dir / "lake.sqlite")  # the catalog, not its files
    with pytest.raises(StoreError, match=r"^store\.data_path: \d+ of the lake's \d+ files are not under "):
        repoint(after)
    with Lake.open(before) as lake:  # the original still opens: its catalog copy was not the one changed,
        assert lake.latest_snapshot() > 0
    with pytest.raises(StoreError, match=r"^store\.data_path: .* is not the lake's data path"):
        Lake.open(after)  # and the copy still records the old path

