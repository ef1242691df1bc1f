"""What a user relies on from the store (the lake of docs/LAKE.md): a
remembered memory is found by the next search, a forgotten one is gone at
once, a replacement answers with its new content and keeps its time, a
broker message delivered twice is applied once, and a second process sees
the first's writes (within ``store.poll_ms`` when it is already running)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

from pipeline.store.lake.follow import reader_for
from pipeline.store.writes import get, parse_records, write
from tests.conftest import store_settings
from tests.lakes import age_forgets

ROOT = Path(__file__).resolve().parents[2]


def _get(ids: list[str]) -> list[dict]:
    from workers.api import get as api_get

    return api_get(ids)


def _ids(query: str, **options) -> list[str]:
    from workers.api import search

    return [r.id for r in search(query, **options).results]


def test_a_remembered_memory_is_found_by_the_next_search(embedded):
    from workers.api import remember

    assert _ids("quokka") == []  # nothing written yet
    first = remember([{"id": f"n{i}", "namespace": "notes", "content": f"note {i} on the deploy window"}
                      for i in range(5)])
    assert first.inserted == 5 and "n3" in _ids("note 3 deploy window", mode="keyword")
    second = remember({"id": "q1", "namespace": "notes", "content": "a quokka crossed the car park"})
    assert second.inserted == 1 and second.version > first.version
    assert _ids("quokka", mode="keyword") == ["q1"]
    assert _ids("quokka car park", mode="semantic")[0] == "q1"
    assert [m["content"] for m in _get(["q1"])] == ["a quokka crossed the car park"]


def test_a_forgotten_memory_is_gone_at_once(embedded):
    from workers.api import forget, remember

    remember([{"id": "keep", "namespace": "ops", "content": "rotate the vault keys on monday"},
              {"id": "drop", "namespace": "ops", "content": "the vault password is hunter2"}])
    remember({"id": "newer", "namespace": "ops", "content": "vault keys now rotate on friday", "supersedes": ["keep"],
              "conflicts": ["drop"]})
    assert "drop" in _ids("vault password hunter2", mode="keyword")
    done = forget(["drop", "never-was"])
    assert done.forgotten == 1 and done.not_found == ["never-was"]
    assert "drop" not in _ids("vault password hunter2") and _get(["drop"]) == []
    assert _get(["newer"])[0]["conflicts"] == []  # no link to a forgotten memory
    assert _get(["newer"])[0]["supersedes"] == ["keep"]
    assert forget("drop").forgotten == 0


def test_a_replaced_memory_answers_with_its_new_content_and_keeps_its_created_at(embedded):
    from workers.api import remember

    remember([{"id": f"f{i}", "namespace": "facts", "content": f"filler fact {i}"} for i in range(4)])
    remember({"id": "r", "namespace": "facts", "content": "the office is in lisbon",
              "created_at": "2020-01-02T03:04:05Z"})
    moved = remember({"id": "r", "namespace": "facts", "content": "the office moved to porto"})
    assert (moved.updated, moved.inserted, moved.embedded) == (1, 0, 1)
    (r,) = _get(["r"])
    assert r["content"] == "the office moved to porto" and r["created_at"] == "2020-01-02T03:04:05+00:00"
    assert "r" not in _ids("lisbon", mode="keyword") and _ids("porto", mode="keyword") == ["r"]
    same = remember({"id": "r", "namespace": "facts", "content": "the office moved to porto"})
    assert same.unchanged == 1 and same.version == moved.version  # nothing written
    tagged = remember({"id": "r", "namespace": "facts", "content": "the office moved to porto", "topics": ["office"]})
    assert (tagged.updated, tagged.embedded) == (1, 0)  # same content: its embedding is reused
    assert _ids("porto", topics=["office"]) == ["r"]


def test_a_write_delivered_twice_is_applied_once(embedded):
    from workers.app import get_app

    remember_task, forget_task = get_app().tasks["ingest.remember"], get_app().tasks["ingest.forget"]
    first = remember_task.apply(args=[[{"id": "t1", "namespace": "n", "content": "a memory sent twice"}]],
                                task_id="message-a").get()
    remember_task.apply(args=[[{"id": "t1", "namespace": "n", "content": "a later edit stands"}]],
                        task_id="message-b").get()
    again = remember_task.apply(args=[[{"id": "t1", "namespace": "n", "content": "a memory sent twice"}]],
                                task_id="message-a").get()
    assert again["replayed"] and again["version"] == first["version"]
    assert _get(["t1"])[0]["content"] == "a later edit stands"
    gone = forget_task.apply(args=[["t1"]], task_id="message-c").get()
    twice = forget_task.apply(args=[["t1"]], task_id="message-c").get()
    assert gone["forgotten"] == 1 and twice["replayed"] and twice["version"] == gone["version"]
    remember_task.apply(args=[[{"id": "t1", "namespace": "n", "content": "back again"}]], task_id="message-d").get()
    assert forget_task.apply(args=[["t1"]], task_id="message-c").get()["replayed"]
    assert _get(["t1"])[0]["content"] == "back again"


def test_on_the_lake_a_write_delivered_again_after_its_snapshot_expired_is_still_applied_once(tmp_path):
    """An erase expires every older snapshot, commit messages with them: a
    message delivered again after it (a worker killed before its ack, the
    broker's lease run out) is still answered ``replayed``, not validated
    again (its link to a memory forgotten since would be refused) nor
    embedded again."""
    import workers
    from pipeline.store.lake import Lake
    from pipeline.store.maintenance import compact
    from workers import audit, resources
    from workers.app import get_app

    settings = store_settings(tmp_path)
    workers.configure(settings)
    try:
        remember_task = get_app().tasks["ingest.remember"]
        remember_task.apply(args=[[{"id": "old", "namespace": "n", "content": "the old rule"}]]).get()
        record = {"id": "new", "namespace": "n", "content": "the new rule", "supersedes": ["old"]}
        first = remember_task.apply(args=[[record]], task_id="message-x").get()
        get_app().tasks["ingest.forget"].apply(args=[["old"]]).get()
        age_forgets(settings, timedelta(hours=2))  # the forget due: the erase expires every snapshot before it
        assert compact(settings, wait=True).ran
        with Lake.open(settings) as lake:
            assert lake.con.execute("SELECT count(*) FROM ducklake_snapshots('lake') WHERE snapshot_id = ?",
                                    [first["version"]]).fetchone()[0] == 0, "the write's snapshot must be gone"
        again = remember_task.apply(args=[[record]], task_id="message-x").get()
        assert again["replayed"] and again["inserted"] == 0 and again["embedded"] == 0
        assert _get(["new"])[0]["content"] == "the new rule"
    finally:
        audit.flush()
        resources.current().close_store()


def _other_process(tmp_path: Path, settings, body: str) -> dict:
    """Run ``body`` (it sets ``out``) in a new Python process on ``settings``' lake; its ``out``."""
    script = textwrap.dedent("""
        import json
        from pipeline.settings import Settings
        from pipeline.store.writes import get, parse_records, write
        settings = Settings()
        out = {}
    """) + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DIMPLE_DATA_DIR": str(settings.data_dir),
           "DIMPLE_EMBEDDING_MODEL": "hash-64"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_on_the_lake_another_process_sees_the_writes_of_one_running_and_of_one_before(tmp_path):
    settings = store_settings(tmp_path)
    settings.store.poll_ms = 500
    reader = reader_for(settings)  # a warm search process, started on an empty store
    try:
        assert reader.snapshot() is None
        first = _other_process(tmp_path, settings, """
            report = write(settings, parse_records([{"id": "early", "namespace": "n", "content": "written first"}],
                                                   settings))
            out["version"] = report.version
        """)
        time.sleep(settings.store.poll_ms / 1000)  # the bound: by now this process has asked again
        snap = reader.snapshot()
        assert snap is not None and snap.version == first["version"]
        assert [m["content"] for m in get(settings, ["early"], reader=reader)] == ["written first"]

        later = write(settings, parse_records([{"id": "late", "namespace": "n", "content": "written second"}],
                                              settings), reader=reader)
        assert later.version > first["version"]
        assert reader.snapshot().version == later.version  # its own write: read at once, no wait
        seen = _other_process(tmp_path, settings, """
            out["contents"] = [m["content"] for m in get(settings, ["early", "late"])]
            out["forgot"] = write(settings, forget=["early"]).forgotten
        """)
        assert seen == {"contents": ["written first", "written second"], "forgot": 1}
        time.sleep(settings.store.poll_ms / 1000)
        assert get(settings, ["early", "late"], reader=reader)[0]["id"] == "late"
    finally:
        reader.close()


def test_on_the_lake_a_large_write_builds_a_base_that_a_running_reader_takes_up(tmp_path):
    settings = store_settings(tmp_path)
    settings.compact_delta_memories = 5

    def batch(prefix: str, n: int):
        return parse_records([{"id": f"{prefix}{i}", "namespace": "n", "content": f"{prefix} memory {i}"}
                              for i in range(n)], settings)

    reader = reader_for(settings)
    try:
        assert write(settings, batch("a", 2), reader=reader).compacted  # the first write builds the first base
        first = reader.snapshot()
        assert first is not None and first.overlay.empty
        assert not write(settings, batch("b", 1), reader=reader).compacted
        assert list(reader.snapshot().overlay.members) == ["b0"]  # a delta over the base
        large = write(settings, batch("c", 5), reader=reader)
        assert large.compacted
        reader.wait_ready()  # the new base loads in the background
        now = reader.snapshot()
        assert now.version == large.version and now.base != first.base and now.overlay.empty
        every = [f"a{i}" for i in range(2)] + ["b0"] + [f"c{i}" for i in range(5)]
        assert [m["id"] for m in get(settings, every, reader=reader)] == every
    finally:
        reader.close()


def test_on_the_lake_a_memory_forgotten_and_remembered_again_does_not_get_its_old_links_back(embedded):
    """The lake deletes every link to a forgotten memory: the answer does not
    depend on when a base was built."""
    from workers.api import forget, remember, search

    old = {"id": "old", "namespace": "o", "content": "the office is in lisbon"}
    remember([old, {"id": "new", "namespace": "o", "content": "the office moved to porto", "supersedes": ["old"]},
              {"id": "pal", "namespace": "o", "content": "the office may be in faro", "conflicts": ["old"]},
              {"id": "fan", "namespace": "o", "content": "lisbon office fan club", "supported_by": ["old"]}])
    remember({"id": "new2", "namespace": "o", "content": "the office moved again, to braga", "supersedes": ["old"]})
    forget("old")
    remember(old)

    def links() -> tuple:
        hit = [r for r in search("office lisbon", supersession="annotate").results if r.id == "old"]
        return ([(m["id"], m["supersedes"], m["conflicts"], m["supported_by"])
                 for m in _get(["new", "pal", "fan", "new2"])], [link.id for link in hit[0].superseded_by])

    assert links() == ([("new", [], [], []), ("pal", [], [], []), ("fan", [], [], []), ("new2", [], [], [])], [])
    again = remember({"id": "fan", "namespace": "o", "content": "lisbon office fan club", "supported_by": ["old"]})
    assert again.updated == 1  # not taken as unchanged: declared anew, its link is back
    after = ([("new", [], [], []), ("pal", [], [], []), ("fan", [], [], ["old"]), ("new2", [], [], [])], [])
    assert links() == after
    embedded.compact_delta_memories = 1  # the next write builds a base at its snapshot
    assert remember({"id": "x", "namespace": "o", "content": "unrelated"}).compacted
    assert links() == after

