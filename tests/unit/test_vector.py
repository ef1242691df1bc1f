"""The vector leg: beam descent over ``VectorIndex`` (tie-breaks, bounds,
agreement with exact search, scope, masks, deadlines)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from pipeline.contracts import Batch, Budget, LegRun, Query, QueryOptions, QueryState, Scope
from pipeline.embedders import HashEmbedder
from pipeline.errors import InputError
from pipeline.settings import Settings, TreeSettings
from pipeline.stages.descend import descend_batch
from pipeline.store import ingest
from pipeline.store.database import Store
from pipeline.store.vector import ROOT, Kernels, VectorIndex, descend, exact, load_tree

DIM = 4


def _unit_at(s: float) -> np.ndarray:
    """A unit vector whose dot product with e0 is ``s``."""
    return np.array([s, math.sqrt(max(1 - s * s, 0.0)), 0, 0], dtype=np.float32)


def hand_index(topics, rows) -> VectorIndex:
    """A VectorIndex built by hand.

    ``topics``: (key, parent key, is_leaf, centroid), the root first; children keep
    the order given here (not sorted), so a tie-break must come from the keys.
    ``rows``: (id, namespace, content_type, leaf key, embedding), grouped by leaf.
    """
    keys = [t[0] for t in topics]
    ki = {k: i for i, k in enumerate(keys)}
    T = len(keys)
    centroids = np.stack([np.zeros(DIM, np.float32) if t[3] is None else np.asarray(t[3], np.float32) for t in topics])
    parent = np.array([-1 if t[1] is None else ki[t[1]] for t in topics], dtype=np.int64)
    is_leaf = np.array([t[2] for t in topics], dtype=bool)
    children = [np.array([j for j in range(T) if parent[j] == i], dtype=np.int64) for i in range(T)]
    ids = [r[0] for r in rows]
    namespaces = sorted({r[1] for r in rows})
    ctypes = sorted({r[2] for r in rows})
    row_leaf = np.array([ki[r[3]] for r in rows], dtype=np.int64)
    leaf_start = np.zeros(T, np.int64)
    leaf_end = np.zeros(T, np.int64)
    for i in range(T):
        where = np.flatnonzero(row_leaf == i)
        if len(where):
            assert np.array_equal(where, np.arange(where[0], where[-1] + 1)), "rows must be grouped by leaf"
            leaf_start[i], leaf_end[i] = where[0], where[-1] + 1
    id_rank = np.empty(len(ids), np.int64)
    id_rank[np.argsort(np.asarray(ids, dtype=object), kind="stable")] = np.arange(len(ids))
    return VectorIndex(
        generation=0, ids=ids, emb=np.stack([np.asarray(r[4], np.float32) for r in rows]), id_rank=id_rank,
        namespaces=namespaces, ns_code=np.array([namespaces.index(r[1]) for r in rows], np.int32),
        content_types=ctypes, ct_code=np.array([ctypes.index(r[2]) for r in rows], np.int32),
        row_leaf=row_leaf, keys=keys, centroids=centroids, parent=parent, is_leaf=is_leaf,
        children=children, leaf_start=leaf_start, leaf_end=leaf_end,
        key_index=ki, row_of={m: i for i, m in enumerate(ids)},
    )


E0 = _unit_at(1.0)


def _descend(index, query=E0, *, beam=1, depth=12, top_k=10, start=None, mask=None, deadline=None):
    return descend(index, np.asarray(query, np.float32), [0] if start is None else start,
                   beam_width=beam, max_depth=depth, top_k=top_k, mask=mask, deadline=deadline)


# -- tie-breaking -------------------------------------------------------------------
def test_equal_sibling_leaves_keep_the_smaller_key():
    # both leaves have centroid e0 (score exactly 1.0); "zz-leaf" comes first in the
    # children order, but the tie is broken by topic key: "aa-leaf" wins.
    index = hand_index(
        [(ROOT, None, False, None), ("ns:x", ROOT, False, E0), ("zz-leaf", "ns:x", True, E0), ("aa-leaf", "ns:x", True, E0)],
        [("z1", "x", "text", "zz-leaf", E0), ("a1", "x", "text", "aa-leaf", E0)],
    )
    hits, profile = _descend(index, beam=1)
    assert profile["reached"] == ["aa-leaf"]
    assert hits == [("a1", 1.0)]


def test_equal_internal_siblings_keep_the_smaller_key_at_every_level():
    index = hand_index(
        [
            (ROOT, None, False, None), ("ns:x", ROOT, False, E0),
            ("b-int", "ns:x", False, E0), ("a-int", "ns:x", False, E0),
            ("b-leaf", "b-int", True, E0), ("a-leaf2", "a-int", True, E0), ("a-leaf1", "a-int", True, E0),
        ],
        [("b1", "x", "t", "b-leaf", E0), ("a2", "x", "t", "a-leaf2", E0), ("a1", "x", "t", "a-leaf1", E0)],
    )
    hits, profile = _descend(index, beam=1)
    assert profile["reached"] == ["a-leaf1"]
    assert [h[0] for h in hits] == ["a1"]
    # beam 2 keeps both internal nodes, then the three leaves tie at 1.0 and the two
    # smallest keys win: a-leaf1, a-leaf2 (b-leaf is cut)
    _, profile = _descend(index, beam=2)
    assert profile["reached"] == ["a-leaf1", "a-leaf2"]


def test_leaf_in_the_frontier_competes_with_its_own_score():
    # ns -> [L (leaf, 0.5), I (internal, 0.9)]; I -> [J1 (0.95), J2 (0.7)].
    # beam 2: depth 1 keeps I, L; depth 2 ranks J1 .95 > J2 .7 > L .5 -> J1, J2.
    index = hand_index(
        [
            (ROOT, None, False, None), ("ns:x", ROOT, False, E0),
            ("L", "ns:x", True, _unit_at(0.5)), ("I", "ns:x", False, _unit_at(0.9)),
            ("J1", "I", True, _unit_at(0.95)), ("J2", "I", True, _unit_at(0.7)),
        ],
        [("l", "x", "t", "L", _unit_at(0.5)), ("j1", "x", "t", "J1", _unit_at(0.95)), ("j2", "x", "t", "J2", _unit_at(0.7))],
    )
    hits, profile = _descend(index, beam=2)
    assert sorted(profile["reached"]) == ["J1", "J2"]
    assert [h[0] for h in hits] == ["j1", "j2"]
    # beam 3 reaches all three leaves
    _, profile = _descend(index, beam=3)
    assert sorted(profile["reached"]) == ["J1", "J2", "L"]


def test_a_traced_descent_ranks_every_candidate_at_each_depth():
    """``trace`` (pipeline.audit.whynot reads it): per depth, every candidate
    best first with its centroid score, the beam's first ``beam_width`` kept;
    the hits are those of the untraced descent, numpy or compiled."""
    index = hand_index(
        [
            (ROOT, None, False, None), ("ns:x", ROOT, False, E0),
            ("L", "ns:x", True, _unit_at(0.5)), ("I", "ns:x", False, _unit_at(0.9)),
            ("J1", "I", True, _unit_at(0.95)), ("J2", "I", True, _unit_at(0.7)),
        ],
        [("l", "x", "t", "L", _unit_at(0.5)), ("j1", "x", "t", "J1", _unit_at(0.95)), ("j2", "x", "t", "J2", _unit_at(0.7))],
    )
    trace: list = []
    hits, profile = descend(index, E0, [0], beam_width=1, max_depth=12, top_k=10, trace=trace)
    # depth 1: the root's child ns:x (the only one); 2: I .9 > L .5, I kept; 3: J1 .95 > J2 .7
    assert [[(k, round(s, 4)) for k, s in ranked] for ranked in trace] == [
        [("ns:x", 1.0)], [("I", 0.9), ("L", 0.5)], [("J1", 0.95), ("J2", 0.7)]]
    assert profile["reached"] == ["J1"] and profile["depth"] == len(trace)
    assert hits == _descend(index, beam=1)[0] == [("j1", pytest.approx(0.95))]
    kernels = Kernels()
    kernels.compile()
    compiled, _ = descend(index, E0, [0], beam_width=1, max_depth=12, top_k=10, kernels=kernels)
    assert compiled == hits


def test_equal_memory_scores_are_ordered_by_id():
    index = hand_index(
        [(ROOT, None, False, None), ("ns:x", ROOT, False, E0), ("leaf", "ns:x", True, E0)],
        [("m3", "x", "t", "leaf", E0), ("m1", "x", "t", "leaf", E0), ("m2", "x", "t", "leaf", E0)],
    )
    hits, _ = _descend(index, top_k=2)
    assert hits == [("m1", 1.0), ("m2", 1.0)]


def test_max_depth_too_small_reaches_no_leaf():
    index = hand_index(
        [(ROOT, None, False, None), ("ns:x", ROOT, False, E0), ("leaf", "ns:x", True, E0)],
        [("m1", "x", "t", "leaf", E0)],
    )
    assert _descend(index, depth=1)[0] == []  # depth 1 stops at the namespace node
    assert _descend(index, depth=2)[0] == [("m1", 1.0)]


# -- deadline ---------------------------------------------------------------------
def test_expired_deadline_times_out_with_no_hits(both_paths):
    index = hand_index(
        [(ROOT, None, False, None), ("ns:x", ROOT, False, E0), ("leaf", "ns:x", True, E0)],
        [("m1", "x", "t", "leaf", E0)],
    )
    args = (index, np.asarray(E0, np.float32), [0])
    for hits, profile in both_paths(*args, beam_width=1, max_depth=12, top_k=10, deadline=time.time() - 1):
        assert hits == [] and profile["timed_out"] is True and profile["reached"] == []
    for hits, profile in both_paths(*args, beam_width=1, max_depth=12, top_k=10, deadline=time.time() + 60):
        assert hits == [("m1", 1.0)] and profile["timed_out"] is False and profile["depth"] == 2


def test_descend_batch_reports_a_timed_out_leg_as_not_run():
    index = hand_index(
        [(ROOT, None, False, None), ("ns:x", ROOT, False, E0), ("leaf", "ns:x", True, E0)],
        [("m1", "x", "t", "leaf", E0)],
    )
    q = Query(id="q", text="t", weights={"vector": 1.0, "fts": 1.0}, vector=E0.tolist(),
              started_at=time.time() - 10, budget=Budget(max_ms=1))
    out = descend_batch(Batch(states=[QueryState(query=q)]), index, None, TreeSettings())
    leg = out.states[0].legs["vector"]
    assert leg.ran is False and leg.hits == [] and leg.profile["timed_out"] is True


def test_a_vector_of_another_dimension_is_an_input_error_naming_it():
    index = hand_index(
        [(ROOT, None, False, None), ("ns:x", ROOT, False, E0), ("leaf", "ns:x", True, E0)],
        [("m1", "x", "t", "leaf", E0)],
    )
    q = Query(id="q", text="t", weights={"vector": 1.0}, vector=[0.1, 0.2, 0.3])
    with pytest.raises(InputError, match="vector: 3 dimensions"):
        descend_batch(Batch(states=[QueryState(query=q)]), index, None, TreeSettings())


def test_descend_batch_skips_keyword_queries_and_decided_legs():
    index = hand_index(
        [(ROOT, None, False, None), ("ns:x", ROOT, False, E0), ("leaf", "ns:x", True, E0)],
        [("m1", "x", "t", "leaf", E0)],
    )
    keyword = QueryState(query=Query(id="k", text="t", weights={"vector": 0.0, "fts": 1.0}))
    decided = QueryState(query=Query(id="d", text="t", weights={"vector": 1.0}),
                         legs={"vector": LegRun(leg="vector", ran=False, profile={"timed_out": True})})
    wanted = QueryState(query=Query(id="w", text="t", weights={"vector": 1.0}, vector=E0.tolist()))
    out = descend_batch(Batch(states=[keyword, decided, wanted]), index, None, TreeSettings())
    k, d, w = out.states
    assert k.legs["vector"].ran is False and k.legs["vector"].hits == []
    assert d.legs["vector"].profile == {"timed_out": True}
    assert w.legs["vector"].ran is True and [(h.id, h.rank) for h in w.legs["vector"].hits] == [("m1", 1)]


# -- a real store -------------------------------------------------------------------
WORDS = [
    ["deploy", "window", "release", "tuesday", "freeze"],
    ["redis", "cache", "eviction", "memory", "ttl"],
    ["invoice", "billing", "refund", "stripe", "customer"],
    ["schema", "migration", "column", "index", "postgres"],
    ["oncall", "pager", "incident", "alert", "escalation"],
]
SMALL = TreeSettings(max_leaf_items=8, branching=4, beam_width=2, seed=0)


def _records():
    rng = np.random.default_rng(21)
    out = []
    for i in range(240):
        cluster = int(rng.integers(len(WORDS)))
        words = list(rng.choice(WORDS[cluster], size=3)) + [f"tok{int(rng.integers(40))}"]
        out.append(ingest.MemoryRecord(
            id=f"m{i:03d}", namespace="alpha" if i % 3 else "beta",
            content_type="code" if i % 2 else "text", content=" ".join(words),
            topics=[f"user-t{i % 4}"], concepts=[f"c{i % 5}"],
        ))
    return out


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A store of 240 clustered memories in two namespaces, small leaves; yields (con, index, records)."""
    data = tmp_path_factory.mktemp("vector")
    settings = Settings(data_dir=data, embedding_model="hash-64", _env_file=None, tree=SMALL)
    records = _records()
    with Store.open(settings.data_dir / "base.duckdb", read_only=False, embedding_model="hash-64", embedding_dim=64) as st:
        ingest.ingest_records(st, records, HashEmbedder(64), settings)
    store = Store.open(settings.data_dir / "base.duckdb", read_only=True)
    index = VectorIndex.load(store.con, store.generation, 64)
    yield store.con, index, {r.id: r for r in records}
    store.close()


QUERIES = ["deploy window freeze", "redis ttl", "stripe refund customer", "postgres migration", "pager alert",
           "tok7 cache", "release schema incident", "nothing matches here"]


def _embed(text):
    return HashEmbedder(64).embed([text])[0]


def test_loaded_index_groups_rows_by_leaf_as_stored(real):
    con, index, records = real
    tree = load_tree(con, SMALL)
    assert index.size == len(records) and index.keys[0] == ROOT
    for leaf in tree.leaves():
        t = index.key_index[leaf.key]
        assert index.is_leaf[t]
        rows = range(index.leaf_start[t], index.leaf_end[t])
        assert sorted(index.ids[r] for r in rows) == leaf.members
        assert all(index.row_leaf[r] == t for r in rows)
    for kids in index.children:
        assert [index.keys[k] for k in kids] == sorted(index.keys[k] for k in kids)


def test_loaded_rows_carry_their_own_embedding_codes_and_rank(tmp_path):
    """After updates and deletes (rowids with gaps, rows out of id order) every
    loaded row still holds its memory's embedding, namespace, type and id rank."""
    settings = Settings(data_dir=tmp_path, embedding_model="hash-64", _env_file=None, tree=SMALL)
    records = _records()
    with Store.open(settings.data_dir / "base.duckdb", read_only=False, embedding_model="hash-64", embedding_dim=64) as st:
        ingest.ingest_records(st, records[:150], HashEmbedder(64), settings)
        changed = [r.model_copy(update={"content": r.content + " changed"}) for r in records[:150:7]]
        ingest.ingest_records(st, changed + records[150:], HashEmbedder(64), settings)
        st.con.execute("CHECKPOINT")
    with Store.open(settings.data_dir / "base.duckdb", read_only=True) as st:
        index = VectorIndex.load(st.con, st.generation, 64)
        stored = {m: (np.asarray(e, np.float32), ns, ct) for m, e, ns, ct in
                  st.con.execute("SELECT id, embedding, namespace, content_type FROM memories").fetchall()}
    assert index.size == len(stored) == len(records)
    for row, mid in enumerate(index.ids):
        emb, ns, ct = stored[mid]
        assert np.array_equal(index.emb[row], emb), mid
        assert index.namespaces[index.ns_code[row]] == ns and index.content_types[index.ct_code[row]] == ct
    assert [index.ids[r] for r in np.argsort(index.id_rank)] == sorted(stored)


def test_memories_scored_is_bounded_by_beam_times_leaf_size(real):
    con, index, records = real
    tree = load_tree(con, SMALL)
    for text in QUERIES:
        for beam in (1, 2, 3):
            hits, profile = _descend(index, _embed(text), beam=beam, depth=SMALL.max_depth, top_k=100)
            assert profile["leaves_reached"] <= beam
            assert profile["memories_scored"] <= beam * SMALL.max_leaf_items
            reached = {m for k in profile["reached"] for m in tree.topics[k].members}
            assert profile["memories_scored"] == len(reached)
            assert {h[0] for h in hits} <= reached


def test_wide_beam_equals_exact_search(real):
    con, index, records = real
    wide = len(index.keys)  # more than any level can hold
    for text in QUERIES:
        q = _embed(text)
        for scope in (Scope(), Scope(namespace="alpha"), Scope(namespace="beta")):
            hits, profile = _descend(index, q, beam=wide, depth=64, top_k=15, start=index.start_topics(scope))
            ref = exact(index, q, scope, 15)
            assert [h[0] for h in hits] == [r[0] for r in ref]
            assert [h[1] for h in hits] == pytest.approx([r[1] for r in ref], abs=1e-6)
            assert profile["memories_scored"] == sum(
                1 for r in records.values() if scope.namespace in (None, r.namespace))


def test_namespace_scope_starts_at_that_namespace(real):
    con, index, records = real
    # the query is the exact text of an alpha memory: unscoped, exact search puts it first
    target = next(r for r in records.values() if r.namespace == "alpha")
    q = _embed(target.content)
    assert exact(index, q, Scope(), 1)[0][0] == target.id
    start = index.start_topics(Scope(namespace="beta"))
    assert [index.keys[t] for t in start] == ["ns:beta"]
    for beam in (1, 4, len(index.keys)):
        hits, _ = _descend(index, q, beam=beam, depth=64, top_k=50, start=start)
        assert hits and all(records[m].namespace == "beta" for m, _ in hits)
    assert index.start_topics(Scope(namespace="nowhere")) == []
    # unscoped: every namespace, so the beam never has to choose between them
    assert sorted(index.keys[t] for t in index.start_topics(Scope())) == ["ns:alpha", "ns:beta"]
    assert _descend(index, q, start=[])[0] == []
    assert exact(index, q, Scope(namespace="nowhere"), 5) == []


def test_unscoped_descent_does_not_choose_by_namespace_centroid():
    # ns:x's centroid is closer to the query (0.9 > 0.6), but the best memory
    # (0.99) sits in ns:y: a beam of 1 that had to pick a namespace first would
    # lose it; starting at every namespace, its first cut is among their topics.
    index = hand_index(
        [
            (ROOT, None, False, None), ("ns:x", ROOT, False, _unit_at(0.9)), ("ns:y", ROOT, False, _unit_at(0.6)),
            ("x-leaf", "ns:x", True, _unit_at(0.9)), ("y-far", "ns:y", True, _unit_at(0.2)),
            ("y-near", "ns:y", True, _unit_at(0.99)),
        ],
        [("x1", "x", "t", "x-leaf", _unit_at(0.9)), ("y1", "y", "t", "y-far", _unit_at(0.2)),
         ("y2", "y", "t", "y-near", _unit_at(0.99))],
    )
    start = index.start_topics(Scope())
    assert [index.keys[t] for t in start] == ["ns:x", "ns:y"]
    hits, profile = _descend(index, beam=1, top_k=1, start=start)
    assert profile["reached"] == ["y-near"] and hits[0][0] == "y2"
    assert _descend(index, beam=1, top_k=1, start=[0])[0][0][0] == "x1"  # what a root start would do


def test_content_type_mask_is_applied_before_top_k(real):
    con, index, records = real
    mask = index.row_mask(con, Scope(content_types=("code",)))
    assert mask.sum() == sum(1 for r in records.values() if r.content_type == "code")
    # the query is the text of a *text* memory; scoped to code, the top-k is still full
    target = next(r for r in records.values() if r.content_type == "text")
    q = _embed(target.content)
    wide = len(index.keys)
    hits, _ = _descend(index, q, beam=wide, depth=64, top_k=10, mask=mask)
    assert len(hits) == 10
    assert all(records[m].content_type == "code" for m, _ in hits)
    assert [h[0] for h in hits] == [r[0] for r in exact(index, q, Scope(), 10, mask=mask)]
    # a narrow beam only descends into topics holding code rows, and fills from them
    hits, profile = _descend(index, q, beam=1, depth=64, top_k=3, mask=mask)
    assert hits and all(records[m].content_type == "code" for m, _ in hits)
    in_leaf = sum(1 for m in load_tree(con, SMALL).topics[profile["reached"][0]].members
                  if records[m].content_type == "code")
    assert len(hits) == min(3, in_leaf) and profile["memories_scored"] == in_leaf


def test_topic_and_concept_masks(real):
    con, index, records = real
    mask = index.row_mask(con, Scope(topics=("user-t1",), concepts=("c2", "c3")))
    expected = {m for m, r in records.items() if "user-t1" in r.topics and {"c2", "c3"} & set(r.concepts)}
    assert {index.ids[i] for i in np.flatnonzero(mask)} == expected
    assert index.row_mask(con, Scope(namespace="alpha")) is None  # namespace alone is the start topic
    hits, _ = _descend(index, _embed("redis cache"), beam=len(index.keys), depth=64, top_k=100, mask=mask)
    assert {m for m, _ in hits} == expected


def test_descend_batch_through_a_scoped_query(real):
    con, index, records = real
    options = QueryOptions(namespace="alpha", content_type=["text"])
    q = Query(id="q", text="redis cache", options=options, weights={"vector": 1.0, "fts": 1.0},
              vector=_embed("redis cache").tolist(), top_k=5)
    out = descend_batch(Batch(states=[QueryState(query=q)]), index, con, SMALL)
    leg = out.states[0].legs["vector"]
    assert leg.ran and leg.hits
    assert [h.rank for h in leg.hits] == list(range(1, len(leg.hits) + 1))
    assert all(records[h.id].namespace == "alpha" and records[h.id].content_type == "text" for h in leg.hits)
    assert leg.profile["memories_scored"] <= SMALL.beam_width * SMALL.max_leaf_items


# -- the compiled loops against the numpy loops ---------------------------------------
@pytest.fixture
def both_paths(monkeypatch):
    """Run a descent with the numpy loops, then with the compiled ones."""
    compiled = Kernels()
    compiled.compile()
    assert compiled.compiled is not None

    def run(*args, **kwargs):
        return descend(*args, kernels=Kernels(), **kwargs), descend(*args, kernels=compiled, **kwargs)

    return run


@pytest.mark.parametrize("seed", range(12))
def test_the_compiled_loops_keep_what_the_numpy_loops_keep_with_many_ties(seed, both_paths):
    """Random trees whose centroids and embeddings take a few exact values
    (dot products exact in float32 whatever the summation order), so ties
    between topics and between memories are everywhere: both paths reach the
    same leaves in the same order and return the same memories and scores."""
    rng = np.random.default_rng(seed)
    levels = [0.0, 0.5, 1.0]
    vec = lambda: np.asarray(rng.choice(levels, DIM), np.float32)  # noqa: E731
    topics = [(ROOT, None, False, None)]
    rows = []
    for ns in ("x", "y"):
        topics.append((f"ns:{ns}", ROOT, False, vec()))
        internal = [f"ns:{ns}"]
        for i in range(int(rng.integers(2, 5))):
            key = f"{ns}/i{rng.integers(0, 10**6)}-{i}"
            topics.append((key, rng.choice(internal), False, vec()))
            internal.append(key)
        for i in range(int(rng.integers(4, 10))):
            key = f"{ns}/l{rng.integers(0, 10**6)}-{i}"
            topics.append((key, internal[int(rng.integers(1, len(internal)))], True, vec()))
            rows += [(f"m{len(rows) + j:03d}-{rng.integers(0, 99)}", ns, str(rng.choice(["a", "b"])), key, vec())
                     for j in range(int(rng.integers(1, 6)))]
    # hand_index wants rows grouped by leaf and every internal topic to have a child
    used = {r[3] for r in rows}
    topics = [t for t in topics if not t[2] or t[0] in used]
    parents = {t[1] for t in topics}
    topics = [t for t in topics if t[2] or t[0] in parents or t[0] == ROOT]
    rows.sort(key=lambda r: r[3])
    index = hand_index(topics, rows)
    ties = 0
    for trial in range(20):
        query = vec()
        beam, top_k = int(rng.integers(1, 6)), int(rng.integers(1, 12))
        mask = rng.random(index.size) < 0.7 if trial % 3 == 1 else None
        exclude = rng.random(index.size) < 0.2 if trial % 4 == 2 else None
        start = index.children[0].tolist() if trial % 2 else [index.key_index["ns:x"]]
        (want, want_profile), (got, profile) = both_paths(index, query, start, beam_width=beam, max_depth=12,
                                                          top_k=top_k, mask=mask, exclude=exclude)
        assert profile["reached"] == want_profile["reached"]
        assert (profile["topics_scored"], profile["memories_scored"]) == (want_profile["topics_scored"],
                                                                          want_profile["memories_scored"])
        assert got == want
        ties += len({s for _, s in got}) < len(got)
    assert ties  # the case this test is for


def test_on_a_stored_tree_both_paths_return_the_same_memories(real, both_paths):
    _, index, _ = real
    rng = np.random.default_rng(5)
    for beam in (1, 4, 1024):
        for _ in range(10):
            q = index.emb[rng.integers(index.size)]
            (want, _), (got, _) = both_paths(index, q, index.start_topics(Scope()), beam_width=beam, max_depth=12,
                                             top_k=20)
            assert [m for m, _ in got] == [m for m, _ in want]
            assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)


def test_without_numba_the_descent_keeps_its_numpy_loops(monkeypatch):
    import logging
    import sys

    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("dimple.descend")
    logger.addHandler(handler)
    try:
        kernels = Kernels()
        monkeypatch.setitem(sys.modules, "pipeline.store.vector.kernels", None)  # import fails
        monkeypatch.delattr("pipeline.store.vector.kernels", raising=False)
        kernels.compile()
    finally:
        logger.removeHandler(handler)
    assert kernels.compiled is None
    assert any("keeps its numpy loops" in line for line in said)
    index = hand_index(
        [(ROOT, None, False, None), ("ns:x", ROOT, False, E0), ("leaf", "ns:x", True, E0)],
        [("m1", "x", "t", "leaf", E0)],
    )
    assert descend(index, np.asarray(E0, np.float32), [0], beam_width=1, max_depth=12, top_k=10,
                   kernels=kernels)[0] == [("m1", 1.0)]


@pytest.mark.parametrize("seed", range(6))
def test_the_int8_screen_keeps_what_float32_keeps_when_children_differ_below_its_step(seed, both_paths):
    """A top level of 300 topics whose centroids differ from each other by
    2**-12 here and there, far below an int8 step (1/127 of the largest
    entry), with 384 dimensions (the model's): the compiled beam screens
    them in int8 and scores again in float32 only those its error bound
    cannot rule out, and still reaches the leaves the numpy loops (every
    child in float32) reach, in the same order, with the same memories.
    Entries are multiples of 2**-13, so both paths' sums are exact."""
    d = 384
    rng = np.random.default_rng(100 + seed)
    base = rng.choice([0.0, 0.5, 1.0], d)

    def near() -> np.ndarray:
        v = base.copy()
        at = rng.choice(d, 8, replace=False)
        v[at] += rng.integers(-2, 3, 8) * 2.0**-12
        return np.asarray(v, np.float32)

    topics = [(ROOT, None, False, np.zeros(d, np.float32)), ("ns:x", ROOT, False, near())]
    rows = []
    for i in range(300):
        key = f"x/l{i:03d}"
        topics.append((key, "ns:x", True, near()))
        rows += [(f"m{i:03d}-{j}", "x", "a", key, near()) for j in range(int(rng.integers(1, 3)))]
    index = hand_index(topics, rows)
    start = [index.key_index["ns:x"]]
    for _ in range(12):
        query = np.asarray(rng.choice([0.0, 0.5, 1.0], d), np.float32)
        beam = int(rng.choice([1, 2, 5, 16, 40]))
        (want, want_profile), (got, profile) = both_paths(index, query, start, beam_width=beam, max_depth=12, top_k=10)
        assert profile["reached"] == want_profile["reached"] and len(profile["reached"]) == beam
        assert got == want


def test_the_int8_screen_scores_few_children_again_when_they_are_spread():
    """300 top-level topics with unrelated centroids: the first pass rules
    most of them out, and only those near the best five are scored again in
    float32 (written to the topic scores); the five kept are float32's best."""
    from pipeline.store.vector import kernels as descend_kernels

    d = 384
    rng = np.random.default_rng(7)
    levels = [0.0, 0.5, 1.0]
    topics = [(ROOT, None, False, np.zeros(d, np.float32)), ("ns:x", ROOT, False, np.ones(d, np.float32))]
    topics += [(f"x/l{i:03d}", "ns:x", True, np.asarray(rng.choice(levels, d), np.float32)) for i in range(300)]
    rows = [(f"m{i:03d}", "x", "a", f"x/l{i:03d}", np.ones(d, np.float32)) for i in range(300)]
    index = hand_index(topics, rows)
    q = np.asarray(rng.choice(levels, d), np.float32)
    scores = np.full(len(index.keys), -7.0, np.float32)
    out = np.empty(5, np.int64)
    reach = float(np.abs(q).sum()) * (0.5 + 2 * 127 * d * 2.0**-23)
    n, scored = descend_kernels.beam(np.asarray([index.key_index["ns:x"]], np.int64), index.is_leaf, index.child_off,
                                     index.child_flat, index.child_centroids, index.child_q8, index.child_scale,
                                     np.zeros(0, bool), q, reach, index.key_rank, scores, out)
    assert (n, scored) == (5, 300)
    rescored = int((scores != -7.0).sum())
    assert 5 <= rescored <= 60
    exact_scores = index.centroids @ q
    leaves = np.flatnonzero(index.is_leaf)
    want = leaves[np.lexsort((index.key_rank[leaves], -exact_scores[leaves]))[:5]]
    assert out.tolist() == want.tolist()
