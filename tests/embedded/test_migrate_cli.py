"""``dimple migrate`` on the command line: a data dir holding a segment store
(the store of earlier versions, written by the last dimple that wrote one:
``tests/segment_stores.py``) is refused by every command that opens the
store (one line naming the command to run, exit 2, no traceback, nothing
written) until it is migrated; then the same commands answer from the lake
as the segment store did, and a second migrate does nothing."""

from __future__ import annotations

import json
import logging
import re

from tests.conftest import use_store
from tests.segment_stores import unpack
from workers.cli import main


def test_a_segment_store_is_refused_on_the_lake_until_migrated(settings, monkeypatch, tmp_path, capsys, caplog):
    import workers
    from workers import audit, resources
    from workers.settings import get_settings

    facts = unpack("cli", settings.data_dir)  # 30 notes ingested, m7 forgotten (version 2); a search's answer
    use_store(monkeypatch, settings)
    get_settings.cache_clear()
    workers.configure(get_settings())
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"id": "new", "namespace": "alpha", "content": "a new note"}) + "\n", encoding="utf-8")
    for argv in (["stats"], ["search", "billing"], ["search", "billing", "--json"], ["forget", "m1"],
                 ["ingest", str(more)]):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert out == "" and err == (f"dimple: error: {settings.data_dir} holds a segment store (MANIFEST, version 2), "
                                     "the store of earlier versions, that is not in the lake yet: run 'dimple "
                                     "migrate' to copy it there\n"), argv
    assert not settings.lake_data_path.exists() or not any(settings.lake_data_path.rglob("*.parquet"))
    # the erase check the refused writes started: nothing to erase, said once, no traceback each minute
    from workers import upkeep
    from workers.app import get_app

    with caplog.at_level(logging.WARNING, logger="dimple.worker"):
        assert not upkeep.check(get_app()) and not upkeep.check(get_app())
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("WARNING", None)]
    assert "skips this store" in caplog.text and "run 'dimple migrate'" in caplog.text
    capsys.readouterr()
    # what the segment store kept beside it: its audit rows (the search that made the fixture) and,
    # written here in its format, tuned settings
    from pipeline import audit as audit_log
    from pipeline.audit.carry import page
    from pipeline.store.tuned import TUNED, Tuned, TunedFusion, read_tuned

    logged = page(settings.audit_path, None, 10)
    assert [r.query_text for r in logged] == [facts["searched"]]
    old = Tuned(version=3, tuned_at="2026-11-30T12:00:00Z", settings=TunedFusion(fusion="rrf", rrf_k=20),
                evidence={"queries": 40})
    (settings.data_dir / TUNED).write_text(old.model_dump_json(), encoding="utf-8")

    assert main(["migrate", "--batch-size", "10"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"batch {i}/3: {n} memories, lake snapshot {i + 1}" for i, n in ((1, 10), (2, 10),
                                                                                                   (3, 9))]
    summary, carried, tuned, stays = out.splitlines()
    assert summary.startswith("migrated 29 memories in 3 batches into the lake sqlite:") and ": snapshot 5, " in summary  # the batches 2-4, the base listed by 5
    assert carried == (f"audit: 1 of the 1 rows of {settings.audit_path} written into the lake's retrieval_log "
                       "(0 were there already)")
    assert tuned == "tuned settings: TUNED.json's (fusion rrf, rrf_k 20) are the lake's now"
    assert stays.startswith(f"the segment store stays in {settings.data_dir} (MANIFEST, segments, WRITE.lock")
    assert stays.endswith(f"remove it: cd {settings.data_dir} && rm -r MANIFEST segments WRITE.lock COMPACT.lock "
                          "TUNED.json audit.duckdb")
    carried_row = audit_log.reader.get(audit_log.log_of(settings), logged[0].query_id)
    assert carried_row is not None and carried_row.sources == logged[0].sources
    # its version was the segment store's, not a lake snapshot: a replay runs at the latest and says so
    assert carried_row.query_profile["segment_version"] == logged[0].query_profile["store_version"] == 2
    assert "store_version" not in carried_row.query_profile
    from workers.api import replay_row, replay_snapshot

    assert replay_snapshot(carried_row) is None
    replayed = replay_row(carried_row)
    assert replayed["replayed_at"] is None and replayed["store_changed"].startswith(
        "logged by the segment store of an earlier version (its version 2), replayed on the lake at snapshot ")
    in_lake = read_tuned(settings)
    assert in_lake is not None and (in_lake.settings, in_lake.evidence) == (old.settings, old.evidence)

    assert main(["search", facts["searched"], "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    # snapshot 7: the base listed by 5, the audit rows carried 6, the tuned settings 7
    assert [r["id"] for r in after["results"]] == facts["answered"] and after["store_version"] == 7
    assert main(["stats"]) == 0 and "memories    29 in 1 namespace(s)" in capsys.readouterr().out
    assert main(["forget", "m1"]) == 0
    forgot = re.fullmatch(r"forgot 1 memory \(store version (\d+)\)\n", capsys.readouterr().out)
    assert forgot and int(forgot[1]) > 7  # the lake is written (the search's audit row may commit in between)
    assert main(["migrate"]) == 0
    again = capsys.readouterr().out
    assert again.startswith("already migrated: 29 memories in 3 batches, lake snapshot 5, at ")
    assert "audit: 0 of the 1 rows" in again and "tuned settings" not in again  # nothing carried twice
    audit.flush()
    resources.current().close_store()
    get_settings.cache_clear()
