"""The segment store: writes as deltas, reads over base + deltas, compaction,
and the promise that a delta store answers exactly as its compacted self."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from pipeline.contracts import Scope
from pipeline.errors import IngestValidationError
from pipeline.store import fulltext, segments
from pipeline.store.compact import compact
from pipeline.store.database import Store
from pipeline.store.reader import Reader
from pipeline.store.writes import get, parse_records, write
from tests.conftest import store_settings


@pytest.fixture
def settings(tmp_path):
    """The segment store (the store of earlier versions, served until ``dimple
    migrate``): these tests read its manifest, deltas and locks."""
    return store_settings(tmp_path, "segments")

WORDS = ("deploy window friday backup restore alpha beta gamma delta kappa lambda migration schema index "
         "cache latency queue worker broker redis duckdb vector tree leaf topic budget scope audit").split()


def _text(rng: random.Random, extra: str = "") -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + (f" {extra}" if extra else "")


def _rec(i: int, rng: random.Random, **kw) -> dict:
    rec = {"id": f"m{i}", "namespace": f"ns{i % 3}", "content": _text(rng, f"tok{i}"),
           "content_type": ("note", "log")[i % 2], "created_at": "2025-01-01T00:00:00Z"}
    rec.update(kw)
    return rec


def _remember(settings, records):
    return write(settings, parse_records(records, settings))


@pytest.fixture
def wide(settings):
    """Settings whose beam reaches every leaf, so the vector leg is exact."""
    return settings.replace(tree={**settings.tree.model_dump(), "beam_width": 1024, "max_leaf_items": 8},
                            compact_max_deltas=10_000)


def _build_history(settings, seed: int = 7):
    rng = random.Random(seed)
    _remember(settings, [_rec(i, rng) for i in range(120)])  # the base
    _remember(settings, [_rec(i, rng) for i in range(120, 140)])  # new memories
    _remember(settings, [_rec(i, rng) for i in range(0, 10)])  # rewritten content
    _remember(settings, [_rec(i, rng, namespace="ns9") for i in range(10, 14)])  # moved namespace
    write(settings, forget=[f"m{i}" for i in range(20, 30)] + ["m125"], reason="asked")
    _remember(settings, [_rec(22, rng)])  # forgotten, then remembered again
    for i in range(140, 150):  # one write each
        _remember(settings, [_rec(i, rng, supersedes=[f"m{i - 100}"])])


QUERIES = ["deploy window", "alpha beta gamma", "tok3 tok125 tok22", "cache latency queue", "friday",
           "schema index migration tree", "tok141 restore", "audit budget scope leaf"]
SCOPES = [Scope(), Scope(namespace="ns1"), Scope(content_types=("log",)), Scope(namespace="ns9"),
          Scope(namespace="ns0", content_types=("note",))]


def test_a_delta_store_scores_bm25_exactly_as_its_compacted_self(wide):
    _build_history(wide)
    reader = Reader(wide.data_dir)
    snap = reader.snapshot()
    assert snap is not None and len(snap.overlay.seqs) >= 10 and snap.overlay.dead_ids
    before = {}
    postings = snap.postings()  # the base's postings in memory: the same scores as the SQL path
    for q in QUERIES:
        for scope in SCOPES:
            before[q, scope] = fulltext.search_live(snap.store.con, q, scope, 20, wide.fulltext, snap.overlay)
            in_memory = fulltext.search_live(snap.store.con, q, scope, 20, wide.fulltext, snap.overlay, postings)
            assert [m for m, _ in in_memory] == [m for m, _ in before[q, scope]], (q, scope)
            assert np.allclose([s for _, s in in_memory], [s for _, s in before[q, scope]], rtol=1e-12, atol=1e-12)
    filled = sum(len(v) >= 10 for v in before.values())
    assert filled >= len(before) * 0.6, "the comparison must not pass on empty answers"
    reader.close()
    compact(wide, wait=True)
    with Store.open(segments.base_path(wide.data_dir), read_only=True) as base:
        for (q, scope), live in before.items():
            merged = fulltext.search(base.con, q, scope, 20, wide.fulltext)
            assert [m for m, _ in live] == [m for m, _ in merged], (q, scope)
            assert np.allclose([s for _, s in live], [s for _, s in merged], rtol=1e-12, atol=1e-12)


def test_the_vector_leg_over_deltas_equals_exact_search_of_the_live_memories(wide):
    from pipeline.embedders import HashEmbedder
    from pipeline.store.vector import delta_hits, descend

    _build_history(wide)
    reader = Reader(wide.data_dir)
    snap = reader.snapshot()
    index, overlay = snap.index(), snap.overlay
    emb = HashEmbedder(64)
    live = {m["id"]: m for m in get(wide, [f"m{i}" for i in range(150)], reader=reader)}
    for q in QUERIES:
        vec = emb.embed([q])[0]
        for scope in (Scope(), Scope(namespace="ns1"), Scope(namespace="ns9")):
            base_hits, _ = descend(index, vec, index.start_topics(scope), beam_width=1024, max_depth=12, top_k=15,
                                   exclude=overlay.dead_rows(index))
            hits = sorted(base_hits + delta_hits(overlay, vec, scope, 15), key=lambda h: (-h[1], h[0]))[:15]
            # the reference: every live memory in scope, embedded as written, scored exactly
            ids = sorted(m for m in live if scope.namespace is None or live[m]["namespace"] == scope.namespace)
            sims = emb.embed([live[m]["content"] for m in ids]) @ vec
            want = sorted(zip(ids, sims.tolist()), key=lambda h: (-h[1], h[0]))[:15]
            assert [m for m, _ in hits] == [m for m, _ in want]
            assert not {m for m, _ in hits} & overlay.forgotten
    reader.close()


def test_forgotten_memories_leave_results_links_and_after_compaction_the_files(embedded, tmp_path):
    from workers import api, resources

    api.remember([{"id": "old", "namespace": "n", "content": "the deploy window is friday SECRET_TOKEN_42"},
                  {"id": "other", "namespace": "n", "content": "backups run nightly"}])
    done = api.remember({"id": "new", "namespace": "n", "content": "the deploy window moved to monday",
                         "supersedes": ["old"]})
    assert done.delta is not None and done.ids == ["new"]
    hit = api.search("deploy window", mode="keyword")
    assert {r.id for r in hit.results} == {"old", "new"}
    assert [link.id for r in hit.results if r.id == "old" for link in r.superseded_by] == ["new"]
    gone = api.forget(["new", "nope"], reason="user asked")
    assert (gone.forgotten, gone.not_found) == (1, ["nope"])
    for mode in ("keyword", "semantic", "hybrid"):
        res = api.search("deploy window monday", mode=mode)
        assert "new" not in {r.id for r in res.results}
        assert all(not r.superseded_by for r in res.results)
    assert api.get(["new", "old"])[0]["id"] == "old"
    api.forget("old")
    assert api.get(["old"]) == []
    compact(resources.current().settings(), wait=True)
    for path in (embedded.data_dir / "segments").glob("base-*.duckdb"):
        assert b"SECRET_TOKEN_42" not in path.read_bytes()
    assert api.search("SECRET_TOKEN_42", mode="keyword").results == []


def test_remember_refuses_bad_records_naming_record_and_field(embedded):
    from workers import api

    with pytest.raises(IngestValidationError) as info:
        api.remember([{"namespace": "n", "content": "fine"}, {"namespace": "", "content": "x"}])
    assert str(info.value.errors[0]).startswith("record 2: namespace")
    assert not segments.exists(embedded.data_dir)  # nothing written


def test_a_write_costs_its_own_size_and_readers_load_only_the_new_delta(settings):
    rng = random.Random(1)
    _remember(settings, [_rec(i, rng) for i in range(300)])
    base = segments.base_path(settings.data_dir)
    base_bytes = base.read_bytes()
    reader = Reader(settings.data_dir)
    first = reader.snapshot()
    report = _remember(settings, [_rec(1000, rng)])
    assert report.delta is not None and not report.compacted
    assert base.read_bytes() == base_bytes  # the base is never rewritten by a write
    delta = settings.data_dir / segments.read_manifest(settings.data_dir).deltas[-1].file
    assert delta.stat().st_size < 4096
    second = reader.snapshot()
    assert second.store is first.store and "m1000" in second.overlay.members
    reader.close()


def test_a_reader_keeps_answering_from_the_old_base_while_the_new_one_loads(settings):
    rng = random.Random(2)
    _remember(settings, [_rec(i, rng) for i in range(100)])
    reader = Reader(settings.data_dir)
    old = reader.snapshot()
    old.index()
    _remember(settings, [_rec(500, rng)])
    assert "m500" in reader.snapshot().overlay.members
    compact(settings, wait=True)
    _remember(settings, [_rec(501, rng)])
    meanwhile = reader.snapshot()  # the new base loads in the background
    assert {"m500", "m501"} <= set(meanwhile.overlay.members) or meanwhile.base != old.base
    reader.wait_ready(30)
    after = reader.snapshot()
    assert after.base == segments.read_manifest(settings.data_dir).base
    assert "m501" in after.overlay.members and "m500" not in after.overlay.members  # m500 is in the base now
    assert after.store.con.execute("SELECT count(*) FROM memories WHERE id = 'm500'").fetchone()[0] == 1
    reader.close()


def test_writers_in_many_threads_all_land(settings):
    import threading

    rng = random.Random(3)
    _remember(settings, [_rec(i, rng) for i in range(20)])
    errors = []

    def one(i):
        try:
            _remember(settings, [{"id": f"t{i}", "namespace": "n", "content": f"thread write {i}"}])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(get(settings, [f"t{i}" for i in range(8)])) == 8


# -- the model check: random writes, forgets and compactions against a dict ------------------
def run_model(settings, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    model: dict[str, dict] = {}
    reader = Reader(settings.data_dir)
    _remember(settings, [_rec(i, rng) for i in range(30)])
    for i in range(30):
        model[f"m{i}"] = _rec(i, random.Random(0))
    model = {m["id"]: m for m in get(settings, list(model), reader=reader)}
    next_id = 30
    for step in range(steps):
        action = rng.random()
        if action < 0.45:
            batch = []
            for _ in range(rng.randint(1, 3)):
                if model and rng.random() < 0.4:
                    mid = rng.choice(sorted(model))
                    i = int(mid[1:])
                else:
                    i, next_id = next_id, next_id + 1
                batch.append(_rec(i, rng))
            batch = list({r["id"]: r for r in batch}.values())
            _remember(settings, batch)
            for r in batch:
                model[r["id"]] = r
        elif action < 0.8 and model:
            ids = rng.sample(sorted(model), k=min(len(model), rng.randint(1, 2)))
            write(settings, forget=ids)
            for m in ids:
                model.pop(m)
        elif action < 0.85:
            compact(settings, wait=True)
        every = [f"m{i}" for i in range(next_id)]
        got = {m["id"]: m for m in get(settings, every, reader=reader)}
        snap = reader.snapshot()
        assert set(got) == set(model), step
        for mid, rec in model.items():
            assert got[mid]["content"] == rec["content"] and got[mid]["namespace"] == rec["namespace"], (step, mid)
        gone = [m for m in every if m not in model]
        if gone and snap.store is not None:
            probe = " ".join(f"tok{m[1:]}" for m in rng.sample(gone, k=min(5, len(gone))))
            with snap.view() as v:
                hits = fulltext.search_until(v.cursor, probe, Scope(), 50, settings.fulltext, None, v.overlay)[0]
            assert not {m for m, _ in hits} - set(model), step
    reader.close()


def test_random_writes_forgets_and_compactions_match_a_model_of_the_store(settings):
    run_model(settings, steps=150, seed=11)


def test_manifest_and_deltas_are_json_and_npy(settings):
    rng = random.Random(4)
    _remember(settings, [_rec(i, rng) for i in range(10)])
    _remember(settings, [_rec(11, rng)])
    manifest = json.loads((settings.data_dir / segments.MANIFEST).read_text())
    assert manifest["format"] == 1 and manifest["deltas"][0]["memories"] == 1
    body = json.loads((settings.data_dir / manifest["deltas"][0]["file"]).read_text())
    assert body["memories"][0]["id"] == "m11" and body["memories"][0]["terms"]


def test_a_delta_memory_is_routed_to_the_leaf_an_insert_would_choose(settings):
    from pipeline.embedders import HashEmbedder
    from pipeline.store.vector import load_tree, namespace_key

    small = settings.replace(tree={**settings.tree.model_dump(), "max_leaf_items": 4})
    rng = random.Random(5)
    _remember(small, [_rec(i, rng, namespace="ns0") for i in range(200)])
    text = "cache latency queue worker tok999"
    _remember(small, [{"id": "routed", "namespace": "ns0", "content": text}])
    reader = Reader(small.data_dir)
    snap = reader.snapshot()
    got = snap.overlay.members["routed"].tree
    tree = load_tree(snap.store.con, small.tree)
    vec = HashEmbedder(64).embed([text])[0]
    key = namespace_key("ns0")
    while not tree.topics[key].is_leaf:
        key = min(tree.topics[key].children, key=lambda c: (-float(tree.topics[c].centroid @ vec), c))
    assert got == tree.path_to(key) and got[-1] == "ns:ns0" and len(got) >= 2  # leaf, ancestors, namespace
    res = fulltext.search_live(snap.store.con, "tok999", Scope(topics=(got[0],)), 5, small.fulltext, snap.overlay)
    assert [m for m, _ in res] == ["routed"]  # a tree-topic scope finds it before compaction
    reader.close()


def test_writes_go_on_while_a_compaction_works_and_survive_it(settings):
    import threading
    import time

    rng = random.Random(6)
    _remember(settings, [_rec(i, rng) for i in range(5000)])
    write(settings, forget=["m1"])  # a forget: the compaction also writes its base afresh
    before = segments.read_manifest(settings.data_dir).next_seq
    worker = threading.Thread(target=compact, args=(settings,), kwargs={"wait": True})
    worker.start()
    while segments.read_manifest(settings.data_dir).next_seq == before and worker.is_alive():
        time.sleep(0.001)  # until the compaction has taken its number and is applying the deltas
    for i in range(3):
        _remember(settings, [{"id": f"during-{i}", "namespace": "n", "content": f"written during compaction {i}"}])
    assert worker.is_alive(), "each write was acknowledged while the compaction was still running"
    worker.join(120)
    manifest = segments.read_manifest(settings.data_dir)
    assert [len(get(settings, [f"during-{i}"])) for i in range(3)] == [1, 1, 1]
    # routed by the base the forget erased from: merged by a second pass of
    # the same compaction (``Manifest.erase_pending``), not left as deltas
    assert manifest.delta_memories == 0 and manifest.erase_pending == []
    assert get(settings, ["m1"]) == []


@pytest.mark.parametrize("forgets", [True, False], ids=["forget: written afresh", "inserts: file copy"])
def test_disk_holds_the_base_the_deltas_and_one_compaction_output_at_most(settings, monkeypatch, forgets):
    """No doubling: a compaction that forgets keeps its working copy in
    memory, not in a second file beside its output."""
    import threading

    rng = random.Random(8)
    _remember(settings, [_rec(i, rng) for i in range(3000)])
    _remember(settings, [_rec(i, rng) for i in range(3000, 3010)])
    compact(settings, wait=True)
    folder = settings.data_dir / segments.SEGMENTS
    bases = lambda: sorted(p.name for p in folder.iterdir() if p.name.startswith("base-") and not p.name.endswith(".wal"))  # noqa: E731
    assert len(bases()) == 1  # a reader still on the replaced base holds it open: its name is gone
    _remember(settings, [_rec(i, rng) for i in range(3010, 3020)])
    if forgets:
        write(settings, forget=["m1", "m2"])

    at_fsync: list[list[str]] = []
    fsync_file = segments.fsync_file
    monkeypatch.setattr(segments, "fsync_file", lambda p: (at_fsync.append(bases()), fsync_file(p))[1])
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:  # may miss a moment; the fsync hook is the deterministic check
        while not done.is_set():
            seen.append(len(bases()))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        report = compact(settings, wait=True)
    finally:
        done.set()
        watcher.join()
    assert report.forgotten == (2 if forgets else 0)
    assert at_fsync and all(len(names) == 2 for names in at_fsync), at_fsync  # the base and the output, complete
    assert max(seen) <= 2
    assert not any(p.name.endswith(".work") for p in folder.iterdir())
    assert get(settings, ["m1"]) == ([] if forgets else get(settings, ["m1"])) and len(get(settings, ["m3015"])) == 1


def test_a_write_delivered_twice_is_published_once(settings):
    """A broker message redelivered after its write landed (a worker killed
    between publishing and acknowledging) is not applied again: the task id
    is the write id and the manifest remembers the recent ones."""
    rng = random.Random(9)
    first = _remember(settings, [_rec(i, rng) for i in range(50)])  # straight into a base
    again = write(settings, parse_records([_rec(0, rng)], settings), write_id="task-0")
    assert again.updated == 1 and not again.replayed  # a different id: a rewrite like any other
    write(settings, parse_records([_rec(60, rng)], settings), write_id="task-a")
    v = segments.read_manifest(settings.data_dir).version
    write(settings, forget=["m60"], write_id="task-b")
    write(settings, parse_records([_rec(60, rng, content="came back, asked again")], settings), write_id="task-c")
    redelivered = write(settings, parse_records([_rec(60, rng)], settings), write_id="task-a")
    assert redelivered.replayed and redelivered.version == v and redelivered.delta is None
    assert get(settings, ["m60"])[0]["content"] == "came back, asked again"  # the later write stands
    assert write(settings, forget=["m60"], write_id="task-b").replayed
    assert len(get(settings, ["m60"])) == 1
    compact(settings, wait=True)
    assert write(settings, forget=["m60"], write_id="task-b").replayed  # compaction keeps the record
    assert first.compacted and segments.read_manifest(settings.data_dir).applied("task-c") is not None


def test_the_ingest_tasks_use_their_task_id_as_the_write_id(settings, embedded):
    from workers.app import get_app

    remember_task, forget_task = get_app().tasks["ingest.remember"], get_app().tasks["ingest.forget"]

    rec = {"id": "t1", "namespace": "n", "content": "a memory sent twice"}
    remember_task.apply(args=[[rec]], task_id="same-message")
    again = remember_task.apply(args=[[{**rec, "content": "an older copy"}]], task_id="same-message").get()
    assert again["replayed"]
    forget_task.apply(args=[["t1"]], task_id="forget-message")
    assert forget_task.apply(args=[["t1"]], task_id="forget-message").get()["replayed"]


def compact_killed_after_publishing(settings, monkeypatch) -> None:
    """A compaction that dies between publishing its manifest and removing the files it replaced."""
    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed after publishing")

    with monkeypatch.context() as m:
        m.setattr(segments, "remove_unreferenced", killed)
        with pytest.raises(KeyboardInterrupt):
            compact(settings, wait=True)


def test_a_compaction_killed_after_publishing_leaves_files_the_next_one_removes(settings, monkeypatch):
    """Killed between publishing its manifest and removing the old files, a
    compaction leaves the old base on disk; the next compaction removes it,
    even when there is nothing left to merge."""
    rng = random.Random(3)
    _remember(settings, [_rec(i, rng) for i in range(60)])
    _remember(settings, [_rec(i, rng) for i in range(60, 64)])
    old_base = segments.read_manifest(settings.data_dir).base
    compact_killed_after_publishing(settings, monkeypatch)
    manifest = segments.read_manifest(settings.data_dir)
    assert manifest.base != old_base and not manifest.deltas
    assert (settings.data_dir / old_base).exists()  # left behind

    report = compact(settings, wait=True)
    assert not report.ran and report.removed == [old_base]
    on_disk = {f"{segments.SEGMENTS}/{p.name}" for p in (settings.data_dir / segments.SEGMENTS).iterdir()}
    assert on_disk <= segments.read_manifest(settings.data_dir).files()
    assert len(get(settings, [f"m{i}" for i in range(64)])) == 64
