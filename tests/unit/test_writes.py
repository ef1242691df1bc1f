"""Writes through the lake's write path and what readers then answer: a
store with snapshots merged over its base scores BM25 exactly as its
compacted self, the vector leg over them equals exact search of the live
memories, a write's new memories are routed to the leaf an insert would
choose, bad records are refused whole, writers in many threads all land, a
broker message's task id is its write id, and random writes, forgets and
compactions match a model of the store."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeline.contracts import Scope
from pipeline.errors import IngestValidationError
from pipeline.store import fulltext
from pipeline.store.database import Store
from pipeline.store.lake.follow import bases, reader_for
from pipeline.store.maintenance import compact
from pipeline.store.writes import get, parse_records, write

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


def test_a_store_with_snapshots_over_its_base_scores_bm25_exactly_as_its_compacted_self(wide):
    _build_history(wide)
    reader = reader_for(wide)
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
    built = bases(wide)
    with Store.open(built[max(built)], read_only=True) as base:
        for (q, scope), live in before.items():
            merged = fulltext.search(base.con, q, scope, 20, wide.fulltext)
            assert [m for m, _ in live] == [m for m, _ in merged], (q, scope)
            assert np.allclose([s for _, s in live], [s for _, s in merged], rtol=1e-12, atol=1e-12)


def test_the_vector_leg_over_snapshots_since_the_base_equals_exact_search_of_the_live_memories(wide):
    from pipeline.embedders import HashEmbedder
    from pipeline.store.vector import delta_hits, descend

    _build_history(wide)
    reader = reader_for(wide)
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


def test_remember_refuses_bad_records_naming_record_and_field(embedded):
    from workers import api

    with pytest.raises(IngestValidationError) as info:
        api.remember([{"namespace": "n", "content": "fine"}, {"namespace": "", "content": "x"}])
    assert str(info.value.errors[0]).startswith("record 2: namespace")
    assert not bases(embedded) and not any(embedded.lake_data_path.rglob("*.parquet"))  # nothing written


def test_remember_refuses_a_record_nested_too_deeply_naming_it(settings):
    """Was: a ``RecursionError`` traceback (a file's line of the same depth was
    already refused as "nested too deeply")."""
    from pipeline.errors import InputError

    deep: dict = {}
    inner = deep
    for _ in range(5_000):
        inner["x"] = {}
        inner = inner["x"]
    with pytest.raises(InputError) as info:
        parse_records([{"namespace": "n", "content": "fine"}, {"namespace": "n", "content": "x", "metadata": deep}],
                      settings)
    assert info.value.field == "records[1]" and "nested too deeply" in info.value.reason


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
    reader = reader_for(settings)
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


@pytest.mark.slow  # 150 lake writes and compactions: about two minutes
def test_random_writes_forgets_and_compactions_match_a_model_of_the_store(settings):
    run_model(settings, steps=150, seed=11)


def test_a_written_memory_is_routed_to_the_leaf_an_insert_would_choose(settings):
    from pipeline.embedders import HashEmbedder
    from pipeline.store.vector import load_tree, namespace_key

    small = settings.replace(tree={**settings.tree.model_dump(), "max_leaf_items": 4})
    rng = random.Random(5)
    _remember(small, [_rec(i, rng, namespace="ns0") for i in range(200)])
    text = "cache latency queue worker tok999"
    _remember(small, [{"id": "routed", "namespace": "ns0", "content": text}])
    reader = reader_for(small)
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


def test_the_ingest_tasks_use_their_task_id_as_the_write_id(settings, embedded):
    from workers.app import get_app

    remember_task, forget_task = get_app().tasks["ingest.remember"], get_app().tasks["ingest.forget"]

    rec = {"id": "t1", "namespace": "n", "content": "a memory sent twice"}
    remember_task.apply(args=[[rec]], task_id="same-message")
    again = remember_task.apply(args=[[{**rec, "content": "an older copy"}]], task_id="same-message").get()
    assert again["replayed"]
    forget_task.apply(args=[["t1"]], task_id="forget-message")
    assert forget_task.apply(args=[["t1"]], task_id="forget-message").get()["replayed"]


def test_a_link_to_a_memory_the_same_write_forgets_is_refused(settings):
    """One write that remembers ``b`` superseding ``a`` and forgets ``a``: the
    forget comes first, so the link names no memory and the record is refused
    naming its field (with ``skip_invalid``, left out). Accepted, the link was
    hidden at first and came back once another memory took the id ``a``."""
    from pipeline.errors import IngestValidationError

    _remember(settings, [{"id": "a", "namespace": "ns", "content": "the old deploy window"}])
    b = {"id": "b", "namespace": "ns", "content": "the new deploy window", "supersedes": ["a"]}
    with pytest.raises(IngestValidationError) as info:
        write(settings, parse_records([b], settings), forget=["a"])
    (error,) = info.value.errors
    assert (error.line, error.field) == (1, "supersedes")
    assert "'a' is forgotten by this same write" in error.reason
    assert [m["id"] for m in get(settings, ["a", "b"])] == ["a"]  # nothing written

    report = write(settings, parse_records([b], settings), forget=["a"], skip_invalid=True)
    assert report.forgotten == 1 and [e.field for e in report.skipped] == ["supersedes"]
    _remember(settings, [{"id": "a", "namespace": "ns", "content": "another memory under the id"}])
    assert get(settings, ["b"]) == []


def test_forget_refuses_an_id_the_store_cannot_hold_naming_it(settings):
    from pipeline.errors import InputError

    _remember(settings, [{"id": "a", "namespace": "ns", "content": "kept"}])
    with pytest.raises(InputError) as info:
        write(settings, None, forget=["a", "bad\ud800id"])
    assert info.value.field == "ids[1]" and "lone surrogate" in info.value.reason
    assert [m["id"] for m in get(settings, ["a"])] == ["a"]
