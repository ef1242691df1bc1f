"""The topic tree: invariants on random clustered vectors, determinism, the
near-duplicate guard, incremental insert/remove, and persistence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from pipeline.embedders import HashEmbedder
from pipeline.settings import TreeSettings
from pipeline.store import ingest
from pipeline.store.database import Store
from pipeline.store.vector import ROOT, Tree, drop_stale_words, load_tree, namespace_key, save_namespaces
from pipeline.store.vector.tree import spherical_kmeans, topic_rows

SMALL = TreeSettings(max_leaf_items=8, branching=4, seed=0)
DIM = 16


def _clustered(rng, n, clusters=5, dim=DIM, spread=0.15):
    centers = rng.normal(size=(clusters, dim))
    labels = rng.integers(clusters, size=n)
    vecs = centers[labels] + spread * rng.normal(size=(n, dim))
    # unit rows, as every embedder gives them
    return (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32), labels


def _texts(labels, prefix="item"):
    return [f"cluster{l} word{l}x {prefix}{i}" for i, l in enumerate(labels)]


def _build(namespaces: dict[str, int], settings=SMALL, seed=1):
    """A tree over random clustered vectors; returns (tree, {ns: ids}, {id: (vector, text)})."""
    rng = np.random.default_rng(seed)
    tree = Tree(settings)
    members, data = {}, {}
    for ns, n in namespaces.items():
        vecs, labels = _clustered(rng, n)
        ids = [f"{ns}-{i:04d}" for i in range(n)]
        texts = _texts(labels)
        tree.build_namespace(ns, ids, vecs, texts)
        members[ns] = ids
        data.update({m: (v, t) for m, v, t in zip(ids, vecs, texts)})
    return tree, members, data


def _leaves_below(tree: Tree, key: str) -> list[str]:
    out, stack = [], [key]
    while stack:
        k = stack.pop()
        t = tree.topics[k]
        if t.is_leaf:
            out.append(k)
        stack.extend(t.children)
    return out


def check_invariants(tree: Tree, members: dict[str, list[str]], max_leaf: int) -> None:
    """Everything a consumer of the tree relies on."""
    everyone = [m for ids in members.values() for m in ids]
    # root children are exactly the namespace nodes
    root = tree.topics[ROOT]
    assert root.children == sorted(namespace_key(ns) for ns in members if members[ns])
    assert root.size == len(everyone)
    # each memory in exactly one leaf, and leaf_of agrees
    seen: dict[str, str] = {}
    for leaf in tree.leaves():
        assert 0 < len(leaf.members) <= max_leaf, (leaf.key, len(leaf.members))
        assert leaf.members == sorted(leaf.members)
        assert leaf.size == len(leaf.members)
        for m in leaf.members:
            assert m not in seen, f"{m} in {seen.get(m)} and {leaf.key}"
            seen[m] = leaf.key
    assert sorted(seen) == sorted(everyone)
    assert tree.leaf_of == seen
    # namespace partition: a namespace's leaves hold only its memories
    all_ns_keys = set()
    for ns, ids in members.items():
        if not ids:
            assert namespace_key(ns) not in tree.topics
            continue
        node = tree.topics[namespace_key(ns)]
        assert node.parent == ROOT and node.depth == 1 and node.namespace == ns
        keys = tree.namespace_keys(ns)
        all_ns_keys.update(keys)
        assert all(tree.topics[k].namespace == ns for k in keys)
        below = {m for k in keys if tree.topics[k].is_leaf for m in tree.topics[k].members}
        assert below == set(ids)
    assert all_ns_keys | {ROOT} == set(tree.topics)  # no orphans
    # structure: parents, depths, sizes, no empty internal topics
    for key, t in tree.topics.items():
        for c in t.children:
            assert tree.topics[c].parent == key
            assert tree.topics[c].depth == t.depth + 1
        assert t.children == sorted(t.children)
        if not t.is_leaf:
            assert t.children or key == ROOT, f"internal topic {key} has no children"
            assert t.size == sum(tree.topics[c].size for c in t.children)
            assert not t.members
        else:
            assert not t.children


def snapshot(tree: Tree) -> dict:
    return {
        k: (t.parent, t.namespace, t.depth, t.is_leaf, t.size, t.label, tuple(t.children), tuple(t.members))
        for k, t in tree.topics.items()
    }


def _max_depth(tree: Tree) -> int:
    return max(t.depth for t in tree.topics.values())


# -- build invariants ----------------------------------------------------------------
def test_invariants_on_random_clustered_vectors():
    tree, members, _ = _build({"alpha": 300, "beta": 120, "gamma": 5})
    check_invariants(tree, members, SMALL.max_leaf_items)
    # 300 memories with leaves of 8 need more than one level below the namespace
    assert _max_depth(tree) >= 3


@hsettings(max_examples=25, deadline=None)
@given(
    sizes=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(1, 120), min_size=1, max_size=3),
    max_leaf=st.integers(2, 20),
    branching=st.integers(2, 6),
    seed=st.integers(0, 2**16),
)
def test_invariants_hold_for_any_shape(sizes, max_leaf, branching, seed):
    settings = TreeSettings(max_leaf_items=max_leaf, branching=branching, seed=seed)
    tree, members, _ = _build(sizes, settings, seed=seed)
    check_invariants(tree, members, max_leaf)


def test_same_seed_and_input_give_the_same_tree():
    one, _, _ = _build({"alpha": 200, "beta": 50}, seed=3)
    two, _, _ = _build({"alpha": 200, "beta": 50}, seed=3)
    assert snapshot(one) == snapshot(two)
    for k in one.topics:
        if one.topics[k].centroid is not None:
            assert np.array_equal(one.topics[k].centroid, two.topics[k].centroid)


def test_input_order_does_not_matter():
    rng = np.random.default_rng(11)
    vecs, labels = _clustered(rng, 150)
    ids = [f"m{i:03d}" for i in range(150)]
    texts = _texts(labels)
    a = Tree(SMALL)
    a.build_namespace("ns", ids, vecs, texts)
    perm = rng.permutation(150)
    b = Tree(SMALL)
    b.build_namespace("ns", [ids[i] for i in perm], vecs[perm], [texts[i] for i in perm])
    assert snapshot(a) == snapshot(b)


def test_namespace_rebuild_leaves_the_other_namespaces_alone():
    tree, members, data = _build({"alpha": 60, "beta": 40})
    before_beta = {k: v for k, v in snapshot(tree).items() if k in set(tree.namespace_keys("beta"))}
    ids = members["alpha"][:30]
    tree.build_namespace("alpha", ids, np.stack([data[m][0] for m in ids]), [data[m][1] for m in ids])
    check_invariants(tree, {"alpha": ids, "beta": members["beta"]}, SMALL.max_leaf_items)
    after_beta = {k: v for k, v in snapshot(tree).items() if k in set(tree.namespace_keys("beta"))}
    assert after_beta == before_beta


# -- near-duplicates ------------------------------------------------------------------
def test_identical_vectors_give_bounded_leaves_and_logarithmic_depth():
    n, settings = 500, TreeSettings(max_leaf_items=8, branching=4, seed=0)
    vecs = np.tile(np.random.default_rng(0).normal(size=DIM), (n, 1))
    ids = [f"dup{i:04d}" for i in range(n)]
    tree = Tree(settings)
    tree.build_namespace("ns", ids, vecs, ["same text"] * n)
    check_invariants(tree, {"ns": ids}, 8)
    # Every split cuts a group into k >= 2 parts of at most ceil(size / 2); the
    # namespace node is depth 1, so a leaf is at depth <= 1 + ceil(log2(n / max_leaf)).
    # (A chain that peels a few points per level would be ~n / 8 = 60 deep.)
    assert _max_depth(tree) <= 1 + math.ceil(math.log2(n / 8))


def test_near_duplicates_keep_depth_logarithmic():
    n = 400
    rng = np.random.default_rng(5)
    base = rng.normal(size=DIM)
    vecs = base + 1e-5 * rng.normal(size=(n, DIM))
    ids = [f"nd{i:04d}" for i in range(n)]
    tree = Tree(SMALL)
    tree.build_namespace("ns", ids, vecs, ["nearly the same"] * n)
    check_invariants(tree, {"ns": ids}, 8)
    # No child keeps more than 90% of its parent (else the split is balanced), so a
    # leaf is at depth <= 1 + ceil(log(n / max_leaf) / log(1 / 0.9)) = 1 + 38 here; a
    # degenerate chain would reach depth ~ n.
    assert _max_depth(tree) <= 1 + math.ceil(math.log(n / 8) / math.log(1 / 0.9))


def test_spherical_kmeans_is_deterministic_and_separates_clear_clusters():
    # two tight clusters around orthogonal axes
    rng = np.random.default_rng(2)
    a = np.eye(DIM)[0] + 0.01 * rng.normal(size=(20, DIM))
    b = np.eye(DIM)[1] + 0.01 * rng.normal(size=(20, DIM))
    vecs = np.vstack([a, b]).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    one = spherical_kmeans(vecs, 2, np.random.default_rng(9), 25)
    two = spherical_kmeans(vecs, 2, np.random.default_rng(9), 25)
    assert np.array_equal(one, two)
    assert len(set(one[:20])) == 1 and len(set(one[20:])) == 1 and one[0] != one[20]


def test_spherical_kmeans_trained_on_a_sample_labels_every_row():
    # 6 clusters of 500: trained on 300 sampled rows, every one of the 3,000 rows
    # still gets the label of its own cluster
    rng = np.random.default_rng(3)
    centers = np.eye(DIM)[:6]
    truth = np.repeat(np.arange(6), 500)
    vecs = (centers[truth] + 0.05 * rng.normal(size=(3000, DIM))).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    labels = spherical_kmeans(vecs, 6, np.random.default_rng(1), 25, sample=300)
    assert len(labels) == 3000
    assert all(len(set(labels[truth == c])) == 1 for c in range(6))
    assert len(set(labels)) == 6


def test_wide_branching_puts_leaves_right_below_the_namespace():
    rng = np.random.default_rng(5)
    vecs, labels = _clustered(rng, 2_000, clusters=40)
    ids = [f"m{i:05d}" for i in range(len(vecs))]
    tree = Tree(TreeSettings(max_leaf_items=32, branching=256, seed=0))
    tree.build_namespace("a", ids, vecs, _texts(labels))
    top = tree.topics[namespace_key("a")].children
    assert len(top) >= 0.9 * math.ceil(2_000 / 32)  # k-means may leave a few centres empty
    assert all(len(t.members) <= 32 for t in tree.leaves())
    narrow = Tree(TreeSettings(max_leaf_items=32, branching=4, seed=0))
    narrow.build_namespace("a", ids, vecs, _texts(labels))
    # leaves sit at depth 2 (right below the namespace) or a split or two further
    # down where a k-means cluster overflowed; branching 4 needs 3+ levels first
    wide_depth = np.mean([t.depth for t in tree.leaves()])
    assert wide_depth <= 3.5 and np.mean([t.depth for t in narrow.leaves()]) >= wide_depth + 2


# -- incremental maintenance ------------------------------------------------------------
def _fetch(data):
    def fetch(ids):
        return np.stack([data[m][0] for m in ids]), [data[m][1] for m in ids]
    return fetch


def test_insert_keeps_the_bounds():
    tree, members, data = _build({"alpha": 40, "beta": 10}, seed=4)
    rng = np.random.default_rng(44)
    vecs, labels = _clustered(rng, 120)
    texts = _texts(labels, "new")
    for i, (v, t) in enumerate(zip(vecs, texts)):
        ns = "alpha" if i % 3 else "beta"
        mid = f"{ns}-new{i:03d}"
        data[mid] = (v, t)
        tree.insert(ns, mid, v.astype(np.float32), t, _fetch(data))
        members[ns].append(mid)
        check_invariants(tree, members, SMALL.max_leaf_items)


def test_insert_splits_an_overflowing_leaf():
    rng = np.random.default_rng(8)
    vecs, labels = _clustered(rng, 9, clusters=2)
    ids = [f"m{i}" for i in range(9)]
    texts = _texts(labels)
    data = {m: (v, t) for m, v, t in zip(ids, vecs, texts)}
    tree = Tree(SMALL)
    tree.build_namespace("ns", ids[:8], vecs[:8], texts[:8])
    # 8 memories = max_leaf_items: one leaf under the namespace node
    (leaf_key,) = tree.topics[namespace_key("ns")].children
    assert tree.topics[leaf_key].is_leaf and len(tree.topics[leaf_key].members) == 8
    tree.insert("ns", "m8", vecs[8].astype(np.float32), texts[8], _fetch(data))
    # the 9th overflows it: the old leaf becomes internal, its children leaves
    split = tree.topics[leaf_key]
    assert not split.is_leaf and not split.members and len(split.children) >= 2
    assert all(tree.topics[c].is_leaf for c in split.children)
    assert sorted(m for c in split.children for m in tree.topics[c].members) == ids
    check_invariants(tree, {"ns": ids}, 8)


def test_insert_goes_to_the_nearest_leaf():
    # two orthogonal clusters of 6 (12 > 8, so two leaves); a new point near the
    # second cluster must join the leaf holding that cluster.
    rng = np.random.default_rng(3)
    a = np.eye(DIM)[0] + 0.01 * rng.normal(size=(6, DIM))
    b = np.eye(DIM)[1] + 0.01 * rng.normal(size=(6, DIM))
    vecs = np.vstack([a, b])
    ids = [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(6)]
    texts = ["apple"] * 6 + ["banana"] * 6
    tree = Tree(SMALL)
    tree.build_namespace("ns", ids, vecs, texts)
    leaf_b = tree.leaf_of["b0"]
    assert set(tree.topics[leaf_b].members) == {f"b{i}" for i in range(6)}
    v = (np.eye(DIM)[1] + 0.01 * rng.normal(size=DIM)).astype(np.float32)
    tree.insert("ns", "b-new", v, "banana", _fetch({}))
    assert tree.leaf_of["b-new"] == leaf_b
    check_invariants(tree, {"ns": ids + ["b-new"]}, 8)


def test_insert_into_a_new_namespace_creates_it():
    tree, members, data = _build({"alpha": 20})
    v = np.ones(DIM, dtype=np.float32)
    tree.insert("zeta", "z1", v, "brand new", _fetch(data))
    members["zeta"] = ["z1"]
    check_invariants(tree, members, SMALL.max_leaf_items)
    assert tree.membership("z1")[-1] == (namespace_key("zeta"), "ancestor")


def test_remove_drops_emptied_topics():
    tree, members, _ = _build({"alpha": 80, "beta": 30}, seed=6)
    leaf = tree.leaves()[0]
    key, parent, gone = leaf.key, leaf.parent, list(leaf.members)
    siblings_before = len(tree.topics[parent].children)
    for m in gone:
        tree.remove(m)
        members[leaf.namespace].remove(m)
    assert key not in tree.topics
    if siblings_before > 1:
        assert key not in tree.topics[parent].children
    else:
        assert parent not in tree.topics  # emptied all the way up
    check_invariants(tree, members, SMALL.max_leaf_items)
    # removing a whole namespace removes its node from the root
    for m in list(members["beta"]):
        tree.remove(m)
    members["beta"] = []
    assert namespace_key("beta") not in tree.topics
    check_invariants(tree, members, SMALL.max_leaf_items)
    tree.remove("not-there")  # no-op
    check_invariants(tree, members, SMALL.max_leaf_items)


@hsettings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["insert", "remove"]), st.sampled_from(["a", "b"]), st.integers(0, 10**6)),
        max_size=80,
    ),
    max_leaf=st.integers(2, 6),
    start=st.integers(0, 30),
)
def test_any_sequence_of_inserts_and_removes_keeps_the_invariants(ops, max_leaf, start):
    settings = TreeSettings(max_leaf_items=max_leaf, branching=3, seed=0)
    tree, members, data = _build({"a": start, "b": 3} if start else {"b": 3}, settings, seed=start)
    members.setdefault("a", [])
    rng = np.random.default_rng(start)
    centers = rng.normal(size=(3, DIM))
    for n, (op, ns, x) in enumerate(ops):
        if op == "insert":
            v = centers[x % 3] + 0.2 * rng.normal(size=DIM)
            v = (v / np.linalg.norm(v)).astype(np.float32)
            mid = f"{ns}-op{n}"
            data[mid] = (v, f"word{x % 3} op{n}")
            tree.insert(ns, mid, v, data[mid][1], _fetch(data))
            members[ns].append(mid)
        elif members[ns]:
            mid = members[ns].pop(x % len(members[ns]))
            tree.remove(mid)
        check_invariants(tree, members, max_leaf)


def test_insert_after_removing_a_whole_namespace():
    tree, members, data = _build({"alpha": 12, "beta": 12})
    for m in members["beta"]:
        tree.remove(m)
    tree.insert("beta", "beta-again", np.ones(DIM, dtype=np.float32), "back", _fetch(data))
    members["beta"] = ["beta-again"]
    check_invariants(tree, members, SMALL.max_leaf_items)


# -- persistence ----------------------------------------------------------------------
def _records(n_per_ns: dict[str, int]) -> list[ingest.MemoryRecord]:
    words = ["deploy", "window", "redis", "cache", "timeout", "budget", "owner", "release", "schema", "index"]
    rng = np.random.default_rng(12)
    out = []
    for ns, n in n_per_ns.items():
        for i in range(n):
            text = " ".join(rng.choice(words, size=4)) + f" {ns}{i}"
            out.append(ingest.MemoryRecord(id=f"{ns}-{i:03d}", namespace=ns, content=text))
    return out


@pytest.fixture
def small_tree_settings(settings):
    return settings.model_copy(update={"tree": SMALL})


def test_ingested_tree_loads_back_as_built(small_tree_settings):
    s = small_tree_settings
    records = _records({"alpha": 70, "beta": 25})
    emb = HashEmbedder(64)
    with Store.open(s.data_dir / "base.duckdb", read_only=False, embedding_model="hash-64", embedding_dim=64) as store:
        ingest.ingest_records(store, records, emb, s)
        loaded = load_tree(store.con, s.tree)
    # the same tree, built here directly from the same vectors and texts
    expected = Tree(s.tree)
    for ns in ("alpha", "beta"):
        recs = [r for r in records if r.namespace == ns]
        expected.build_namespace(ns, [r.id for r in recs], emb.embed([r.content for r in recs]), [r.content for r in recs])
    assert snapshot(loaded) == snapshot(expected)
    assert loaded.leaf_of == expected.leaf_of
    for k, t in expected.topics.items():
        if t.centroid is not None:
            np.testing.assert_allclose(loaded.topics[k].centroid, t.centroid, rtol=0, atol=1e-6)
    check_invariants(loaded, {ns: [r.id for r in records if r.namespace == ns] for ns in ("alpha", "beta")}, 8)


def test_topic_rows_read_what_fetchall_reads_with_each_centroid_one_float32_array(small_tree_settings):
    """Every reader of the stored tree (``load_tree``, the router, the vector
    index) reads ``topics`` through ``topic_rows``: the same values and Python
    types as ``fetchall`` (NULL as None), but a centroid as one array, never a
    list of Python floats (at 1M: ~700 MB kept by every search process)."""
    s = small_tree_settings
    with Store.open(s.data_dir / "base.duckdb", read_only=False, embedding_model="hash-64", embedding_dim=64) as store:
        ingest.ingest_records(store, _records({"alpha": 70, "beta": 25}), HashEmbedder(64), s)
        sql = "SELECT topic_key, parent, namespace, depth, is_leaf, centroid, size, label FROM topics ORDER BY 1"
        got, want = topic_rows(store.con, sql), store.con.execute(sql).fetchall()
    assert len(got) == len(want) > 3
    assert any(row[1] is None for row in got) and any(row[5] is None for row in got)  # the root's
    for row, expected in zip(got, want, strict=True):
        for value, fetched in zip(row, expected, strict=True):
            if isinstance(fetched, (list, tuple)):  # FLOAT[dim]: a tuple of Python floats
                assert isinstance(value, np.ndarray) and value.dtype == np.float32 and value.shape == (64,)
                assert value.tolist() == np.asarray(fetched, dtype=np.float32).tolist()
            else:
                assert type(value) is type(fetched) and value == fetched


def test_save_namespaces_round_trips_a_changed_tree(small_tree_settings):
    s = small_tree_settings
    records = _records({"alpha": 40, "beta": 20})
    emb = HashEmbedder(64)
    with Store.open(s.data_dir / "base.duckdb", read_only=False, embedding_model="hash-64", embedding_dim=64) as store:
        ingest.ingest_records(store, records, emb, s)
        tree = load_tree(store.con, s.tree)
        # change alpha in memory: drop ten memories (rows stay in the memories table;
        # the tree is what is being saved)
        for r in records[:10]:
            tree.remove(r.id)
        con = store.con
        con.execute("BEGIN TRANSACTION")
        save_namespaces(con, tree, ["alpha"])
        con.execute("COMMIT")
        again = load_tree(con, s.tree)
        leaf_rows = con.execute("SELECT count(*) FROM memory_topics WHERE kind = 'leaf'").fetchone()[0]
        user_rows = con.execute("SELECT count(*) FROM memory_topics WHERE kind = 'user'").fetchone()[0]
    assert snapshot(again) == snapshot(tree)
    assert again.leaf_of == tree.leaf_of
    assert leaf_rows == len(records) - 10
    assert user_rows == 0  # no user topics given; nothing else touched


def test_a_word_no_member_holds_any_more_leaves_the_topic_keys_and_the_tree_stays_whole():
    """After a forget, a topic key made with the forgotten text's word is renamed without it."""
    tree, members, data = _build({"a": 60, "b": 30})
    before = snapshot(tree)
    gone = next(t.label for t in tree.leaves() if t.namespace == "a").split("-")[0]
    changed = drop_stale_words(tree, ["a"], lambda m: data[m][1].replace(gone, "other"))
    assert changed == ["a"]
    assert not [k for k in tree.namespace_keys("a") if gone in k.split("-")]
    assert [k for k in tree.namespace_keys("b") if gone in k.split("-")]  # not asked: left alone
    assert {k for k, v in before.items() if gone not in v[5].split("-")} <= set(tree.topics)
    check_invariants(tree, members, SMALL.max_leaf_items)
    assert drop_stale_words(tree, ["a"], lambda m: data[m][1].replace(gone, "other")) == []
