"""``dimple migrate`` on the command line: with DIMPLE_STORE__ENGINE=lake, a
data dir holding a segment store is refused by every command that opens the
store (one line naming ``store.engine`` and the command to run, exit 2, no
traceback, nothing written) until it is migrated; then the same commands
answer from the lake, and a second migrate does nothing."""

from __future__ import annotations

import json
import logging
import re

import pytest

from tests.conftest import use_store, write_jsonl
from workers.cli import main

RECORDS = [{"id": f"m{i}", "namespace": "alpha", "content": f"note {i} about billing and the deploy window",
            **({"supersedes": [f"m{i - 1}"]} if i % 5 == 4 else {})} for i in range(30)]


@pytest.fixture
def engine(settings, monkeypatch):
    """Switch the CLI between the engines over one data dir, as a user does with
    DIMPLE_STORE__ENGINE; returns a function taking the engine's name."""
    import workers
    from workers import audit, resources
    from workers.settings import get_settings

    use_store(monkeypatch, settings)

    def use(name: str):
        audit.flush()
        resources.current().close_store()
        monkeypatch.setenv("DIMPLE_STORE__ENGINE", name)
        get_settings.cache_clear()
        workers.configure(get_settings())
        return get_settings()

    yield use
    audit.flush()
    resources.current().close_store()
    get_settings.cache_clear()


def test_a_segment_store_is_refused_on_the_lake_until_migrated(engine, tmp_path, capsys, caplog):
    engine("segments")
    assert main(["ingest", str(write_jsonl(tmp_path / "m.jsonl", RECORDS))]) == 0
    assert main(["forget", "m7"]) == 0
    capsys.readouterr()
    assert main(["search", "deploy window billing", "--json"]) == 0
    before = [r["id"] for r in json.loads(capsys.readouterr().out)["results"]]
    assert main(["migrate"]) == 2  # the segment engine: the lake is the target the lake engine reads
    assert capsys.readouterr().err.startswith("dimple: error: store.engine: 'dimple migrate' copies the segment store")

    settings = engine("lake")
    more = write_jsonl(tmp_path / "more.jsonl", [{"id": "new", "namespace": "alpha", "content": "a new note"}])
    for argv in (["stats"], ["search", "billing"], ["search", "billing", "--json"], ["forget", "m1"],
                 ["ingest", str(more)]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err == (f"dimple: error: store.engine: {settings.data_dir} holds a segment store "
                                     "(MANIFEST, version 2) that is not in the lake yet: run 'dimple migrate' "
                                     "(with DIMPLE_STORE__ENGINE=lake) to copy it there, or set "
                                     "DIMPLE_STORE__ENGINE=segments to go on using it\n"), argv
    assert not settings.lake_data_path.exists() or not any(settings.lake_data_path.rglob("*.parquet"))
    # the erase check the refused writes started: nothing to erase, said once, no traceback each minute
    from workers import upkeep
    from workers.app import get_app

    with caplog.at_level(logging.WARNING, logger="dimple.worker"):
        assert not upkeep.check(get_app()) and not upkeep.check(get_app())
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("WARNING", None)]
    assert "skips this store" in caplog.text and "run 'dimple migrate'" in caplog.text
    capsys.readouterr()

    assert main(["migrate", "--batch-size", "10"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"batch {i}/3: {n} memories, lake snapshot {i + 1}" for i, n in ((1, 10), (2, 10),
                                                                                                   (3, 9))]
    summary, stays = out.splitlines()
    assert summary.startswith("migrated 29 memories in 3 batches into the lake sqlite:") and ": snapshot 5, " in summary  # the batches 2-4, the base listed by 5
    assert stays.startswith(f"the segment store stays in {settings.data_dir} (MANIFEST, segments, WRITE.lock")
    assert stays.endswith(f"remove it: cd {settings.data_dir} && rm -r MANIFEST segments WRITE.lock COMPACT.lock")

    assert main(["search", "deploy window billing", "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in after["results"]] == before and after["store_version"] == 5
    assert main(["stats"]) == 0 and "memories    29 in 1 namespace(s)" in capsys.readouterr().out
    assert main(["forget", "m1"]) == 0
    forgot = re.fullmatch(r"forgot 1 memory \(store version (\d+)\)\n", capsys.readouterr().out)
    assert forgot and int(forgot[1]) > 5  # the lake is written (the search's audit row may commit in between)
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out.startswith("already migrated: 29 memories in 3 batches, lake snapshot 5, at ")
