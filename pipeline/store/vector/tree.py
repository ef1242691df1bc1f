"""The topic tree: deterministic hierarchical clustering and incremental
insertion. The seed's beam descent over it is ``pipeline.store.vector.descent``,
which the vector leg (``pipeline.stages.descend``) runs.

Shape: a root, one node per namespace (namespaces are partitions, so a query
scoped to one namespace descends through that namespace's part only), then
spherical k-means clusters down to leaves of at most ``max_leaf_items``
memories. Keys are readable and stable: the topic's distinctive terms plus a
short hash of its members (``deploy-window-3f9a1c``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline.embedders import normalize
from pipeline.errors import StoreError
from pipeline.settings import TreeSettings

ROOT = "__root__"

_WORD = re.compile(r"[a-z][a-z0-9_]{2,}")
_STOP = frozenset(
    """about above after again against all also and any are because been before being below
    between both but can could did does doing down during each few for from further had has
    have having her here hers herself him himself his how into its itself just let like more
    most much must myself nor not now off once only other our ours ourselves out over own same
    she should some such than that the their theirs them themselves then there these they this
    those through too under until very was were what when where which while who whom why will
    with would you your yours yourself yourselves really yeah yes got get gonna going thanks
    thank know think one two well way see said say things thing lot""".split()
)


def namespace_key(namespace: str) -> str:
    return f"ns:{namespace}"


@dataclass
class Topic:
    """One node of the tree. ``members`` is filled for leaves only."""

    key: str
    parent: str | None
    namespace: str | None
    depth: int
    is_leaf: bool
    centroid: np.ndarray | None
    size: int
    label: str
    children: list[str] = field(default_factory=list)
    members: list[str] = field(default_factory=list)


class Tree:
    """A whole tree in memory, as ingest and reindex maintain it."""

    def __init__(self, settings: TreeSettings):
        self.settings = settings
        self.topics: dict[str, Topic] = {
            ROOT: Topic(ROOT, None, None, 0, False, None, 0, "root")
        }
        self.leaf_of: dict[str, str] = {}

    # -- queries ---------------------------------------------------------
    def path_to(self, key: str) -> list[str]:
        """Keys from ``key`` up to (excluding) the root."""
        out: list[str] = []
        node: str | None = key
        while node is not None and node != ROOT:
            out.append(node)
            node = self.topics[node].parent
        return out

    def membership(self, memory_id: str) -> list[tuple[str, str]]:
        """(topic_key, kind) rows for one memory: its leaf, then its ancestors."""
        path = self.path_to(self.leaf_of[memory_id])
        return [(path[0], "leaf")] + [(k, "ancestor") for k in path[1:]]

    def namespace_keys(self, namespace: str) -> list[str]:
        """Every topic key in one namespace's subtree."""
        ns = namespace_key(namespace)
        if ns not in self.topics:
            return []
        out, stack = [], [ns]
        while stack:
            key = stack.pop()
            out.append(key)
            stack.extend(self.topics[key].children)
        return out

    # -- building --------------------------------------------------------
    def build_namespace(
        self, namespace: str, ids: Sequence[str], vectors: np.ndarray, texts: Sequence[str]
    ) -> None:
        """(Re)build one namespace's subtree from scratch, deterministically."""
        self.drop_namespace(namespace)
        if not len(ids):
            return
        order = np.argsort(np.asarray(ids, dtype=object), kind="stable")
        ids = [ids[i] for i in order]
        vectors = normalize(np.asarray(vectors, dtype=np.float32)[order])
        texts = [texts[i] for i in order]
        df = _document_frequencies(texts)
        rng = np.random.default_rng([self.settings.seed, _stable_int(namespace)])
        ns = namespace_key(namespace)
        self.topics[ns] = Topic(ns, ROOT, namespace, 1, False, _mean(vectors), len(ids), namespace)
        self.topics[ROOT].children.append(ns)
        self.topics[ROOT].children.sort()
        self.topics[ROOT].size += len(ids)
        self._split_into(ns, np.arange(len(ids)), ids, vectors, texts, df, rng)

    def _split_into(self, parent_key, rows, ids, vectors, texts, df, rng) -> None:
        """Cluster ``rows`` below ``parent_key``; recurse until leaves fit."""
        parent = self.topics[parent_key]
        max_leaf = self.settings.max_leaf_items
        if len(rows) <= max_leaf:
            self._make_leaf(parent_key, rows, ids, vectors, texts, df)
            return
        # As wide as ``branching`` allows, widest at the top: a namespace of 10k
        # memories has ~157 children (its leaves, give or take a split), 250k has
        # 256 topics of ~16 leaves. The beam's first cut is then among many small
        # clusters, like an IVF index's coarse quantizer, instead of among a few
        # big ones, where a greedy choice can drop the right branch early.
        k = max(2, min(self.settings.branching, math.ceil(len(rows) / max_leaf)))
        labels = spherical_kmeans(
            vectors[rows], k, rng, self.settings.kmeans_iterations, sample=_SAMPLE_PER_CENTER * k
        )
        groups = [rows[labels == j] for j in range(k)]
        groups = [g for g in groups if len(g)]
        if max(len(g) for g in groups) > 0.9 * len(rows):
            # Near-duplicates defeat k-means (it peels off a few points per
            # level and the tree degenerates into a chain); cut along the
            # principal direction instead, so depth stays logarithmic.
            groups = _balanced_split(vectors[rows], rows, k, rng)
        for group in groups:
            if len(group) <= max_leaf:
                self._make_leaf(parent_key, group, ids, vectors, texts, df)
            else:
                key = self._new_key([ids[i] for i in group], [texts[i] for i in group], df, parent.namespace)
                self.topics[key] = Topic(
                    key, parent_key, parent.namespace, parent.depth + 1, False,
                    _mean(vectors[group]), len(group), _label_of(key),
                )
                parent.children.append(key)
                self._split_into(key, group, ids, vectors, texts, df, rng)
        parent.children.sort()

    def _make_leaf(self, parent_key, rows, ids, vectors, texts, df) -> str:
        parent = self.topics[parent_key]
        member_ids = [ids[i] for i in rows]
        key = self._new_key(member_ids, [texts[i] for i in rows], df, parent.namespace)
        self.topics[key] = Topic(
            key, parent_key, parent.namespace, parent.depth + 1, True,
            _mean(vectors[rows]), len(rows), _label_of(key), members=sorted(member_ids),
        )
        parent.children.append(key)
        for mid in member_ids:
            self.leaf_of[mid] = key
        return key

    def _new_key(self, member_ids, texts, df, namespace) -> str:
        terms = distinctive_terms(texts, df, 2)
        label = "-".join(terms) if terms else "topic"
        digest = hashlib.blake2b(
            "\x00".join([namespace or ""] + sorted(member_ids)).encode(), digest_size=8
        ).hexdigest()
        for width in (6, 10, 16):
            key = f"{label}-{digest[:width]}"
            if key not in self.topics:
                return key
        n = 2
        while f"{label}-{digest}-{n}" in self.topics:
            n += 1
        return f"{label}-{digest}-{n}"

    def drop_namespace(self, namespace: str) -> None:
        for key in self.namespace_keys(namespace):
            topic = self.topics.pop(key)
            for mid in topic.members:
                self.leaf_of.pop(mid, None)
        ns = namespace_key(namespace)
        root = self.topics[ROOT]
        if ns in root.children:
            root.children.remove(ns)
        root.size = sum(self.topics[c].size for c in root.children)

    # -- incremental maintenance -----------------------------------------
    def insert(self, namespace: str, memory_id: str, vector: np.ndarray, text: str, fetch) -> None:
        """Put one memory into its nearest leaf, splitting the leaf if it overflows.

        ``fetch(ids)`` returns ``(vectors, texts)`` of existing members, needed
        only when a leaf splits.
        """
        ns = namespace_key(namespace)
        if ns not in self.topics:
            self.build_namespace(namespace, [memory_id], vector[None, :], [text])
            return
        key = ns
        while not self.topics[key].is_leaf:
            topic = self.topics[key]
            if not topic.children:
                break
            # nearest child; ties go to the smaller key, as in the descent
            key = min(topic.children, key=lambda c: (-float(self.topics[c].centroid @ vector), c))
        for k in self.path_to(key) + [ROOT]:
            t = self.topics[k]
            if t.centroid is not None:
                t.centroid = _unit(t.centroid * t.size + vector)
            t.size += 1
        leaf = self.topics[key]
        if not leaf.is_leaf:  # an emptied internal node: make it a leaf again
            leaf.is_leaf = True
        leaf.members.append(memory_id)
        leaf.members.sort()
        self.leaf_of[memory_id] = key
        if leaf.size > self.settings.max_leaf_items:
            self._split_leaf(key, fetch)

    def _split_leaf(self, key: str, fetch) -> None:
        leaf = self.topics[key]
        ids = list(leaf.members)
        vectors, texts = fetch(ids)
        vectors = normalize(np.asarray(vectors, dtype=np.float32))
        leaf.is_leaf = False
        leaf.members = []
        for mid in ids:
            self.leaf_of.pop(mid, None)
        rng = np.random.default_rng([self.settings.seed, _stable_int(key)])
        self._split_into(key, np.arange(len(ids)), ids, vectors, texts, None, rng)

    def remove(self, memory_id: str, vector: np.ndarray | None = None) -> None:
        """Take one memory out of its leaf, dropping topics left empty; with its
        ``vector``, the centroids above it are moved off it (as ``insert`` moves them on)."""
        key = self.leaf_of.pop(memory_id, None)
        if key is None:
            return
        leaf = self.topics[key]
        leaf.members.remove(memory_id)
        for k in self.path_to(key) + [ROOT]:
            t = self.topics[k]
            if vector is not None and t.centroid is not None and t.size > 1:
                t.centroid = _unit(t.centroid * t.size - vector)
            t.size -= 1
        node = key
        while node != ROOT and self.topics[node].size <= 0:
            parent = self.topics[node].parent
            if parent is None:  # only the root has no parent
                raise StoreError(f"topic tree is broken: topic {node!r} has no parent")
            self.topics.pop(node)
            self.topics[parent].children.remove(node)
            node = parent

    # -- stats -----------------------------------------------------------
    def leaves(self) -> list[Topic]:
        return [t for t in self.topics.values() if t.is_leaf]


# k-means trains on at most this many points per centre, then assigns every
# point once (as FAISS does): the top split of a 250k-memory namespace (256
# centres) trains on 65,536 of them.
_SAMPLE_PER_CENTER = 256
_ASSIGN_CHUNK = 65_536


def spherical_kmeans(
    vectors: np.ndarray, k: int, rng: np.random.Generator, iterations: int, sample: int | None = None
) -> np.ndarray:
    """Cluster unit vectors by cosine; k-means++ seeding from ``rng``.

    Trains on a sample of ``sample`` rows drawn from ``rng`` when there are
    more, then labels every row by its nearest centre. Returns one label per
    row. Deterministic for a given generator state.
    """
    n = len(vectors)
    k = min(k, n)
    train = vectors
    if sample is not None and n > sample:
        train = vectors[np.sort(rng.choice(n, size=sample, replace=False))]
    centers = _kmeans_pp(train, k, rng)
    labels = np.full(len(train), -1, dtype=np.int64)
    for _ in range(iterations):
        new = np.argmax(train @ centers.T, axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
        _update_centers(train, labels, centers)
    if train is vectors:
        return labels
    return np.concatenate([
        np.argmax(vectors[i : i + _ASSIGN_CHUNK] @ centers.T, axis=1) for i in range(0, n, _ASSIGN_CHUNK)
    ])


def _kmeans_pp(vectors: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    n = len(vectors)
    centers = np.empty((k, vectors.shape[1]), dtype=np.float32)
    first = int(rng.integers(n))
    centers[0] = vectors[first]
    closest = 1.0 - vectors @ centers[0]
    for j in range(1, k):
        weights = np.clip(closest, 0, None) ** 2
        total = weights.sum()
        pick = int(rng.choice(n, p=weights / total)) if total > 0 else int(rng.integers(n))
        centers[j] = vectors[pick]
        closest = np.minimum(closest, 1.0 - vectors @ centers[j])
    return centers


def _update_centers(vectors: np.ndarray, labels: np.ndarray, centers: np.ndarray) -> None:
    """Each centre to the unit mean of its members, in place; an empty cluster
    is re-seeded at the worst-served point."""
    order = np.argsort(labels, kind="stable")
    present, starts = np.unique(labels[order], return_index=True)
    sums = np.add.reduceat(vectors[order], starts, axis=0)
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    centers[present] = np.where(norms > 0, sums / np.where(norms > 0, norms, 1), sums)
    if len(present) == len(centers):
        return
    for j in np.setdiff1d(np.arange(len(centers)), present):
        worst = int(np.argmin(np.max(vectors @ centers.T, axis=1)))
        centers[j] = vectors[worst]


def _balanced_split(vectors: np.ndarray, rows: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``k`` equal parts of ``rows`` ordered along their principal direction."""
    centered = vectors - vectors.mean(axis=0)
    direction = rng.standard_normal(int(vectors.shape[1])).astype(np.float32)
    for _ in range(20):
        nxt = centered.T @ (centered @ direction)
        norm = float(np.linalg.norm(nxt))
        if norm == 0:
            break
        direction = nxt / norm
    order = np.argsort(centered @ direction, kind="stable")
    return [rows[part] for part in np.array_split(order, k) if len(part)]


def distinctive_terms(texts: Iterable[str], df: Counter | None, n: int) -> list[str]:
    """The ``n`` terms most typical of ``texts`` against document frequencies ``df``."""
    tf: Counter = Counter()
    for text in texts:
        tf.update(w for w in set(_WORD.findall(text.lower())) if w not in _STOP and not w.isdigit())
    if not tf:
        return []
    total = max(df.get("\x00docs", 1), 1) if df else 1

    def weight(term: str) -> tuple[float, str]:
        idf = math.log((1 + total) / (1 + df.get(term, 0))) + 1.0 if df else 1.0
        return (-tf[term] * idf, term)

    return sorted(tf, key=weight)[:n]


def _document_frequencies(texts: Sequence[str]) -> Counter:
    df: Counter = Counter()
    for text in texts:
        df.update(set(_WORD.findall(text.lower())))
    df["\x00docs"] = len(texts)
    return df


def _label_of(key: str) -> str:
    return key.rsplit("-", 1)[0]


def _mean(vectors: np.ndarray) -> np.ndarray:
    return _unit(np.asarray(vectors, dtype=np.float32).sum(axis=0))


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return (vector / norm).astype(np.float32) if norm > 0 else vector.astype(np.float32)


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


# -- persistence ---------------------------------------------------------------
def topic_rows(con, sql: str) -> list[tuple]:
    """The rows of ``sql`` (a read of ``topics``) as tuples, NULL as None, with
    each centroid one float32 array: read as numpy, not ``fetchall``. At 1M
    memories the tree has ~46,000 centroids, 17.8M floats; as Python floats
    they took ~850 MB at the peak, and ~700 MB stayed in the process (Python's
    allocator keeps the arenas they were freed into), against the matrix's 71 MB."""
    def column(c) -> list:
        data = np.ma.getdata(c)
        # numbers and booleans as Python's (tolist), strings and centroids as they come
        out = data.tolist() if data.dtype != object else list(data)
        return [None if gone else v for v, gone in zip(out, np.ma.getmaskarray(c), strict=True)]

    return list(zip(*(column(c) for c in con.execute(sql).fetchnumpy().values()), strict=True))


def load_tree(con, settings: TreeSettings) -> Tree:
    """The tree as stored, with leaf members, ready for incremental changes."""
    tree = Tree(settings)
    rows = topic_rows(con, "SELECT topic_key, parent, namespace, depth, is_leaf, centroid, size, label FROM topics")
    for key, parent, namespace, depth, is_leaf, centroid, size, label in rows:
        vec = np.asarray(centroid, dtype=np.float32) if centroid is not None else None
        tree.topics[key] = Topic(key, parent, namespace, depth, is_leaf, vec, size, label)
    for topic in list(tree.topics.values()):
        if topic.parent is not None and topic.parent in tree.topics:
            tree.topics[topic.parent].children.append(topic.key)
    for topic in tree.topics.values():
        topic.children.sort()
    for memory_id, key in con.execute(
        "SELECT memory_id, topic_key FROM memory_topics WHERE kind = 'leaf' ORDER BY memory_id"
    ).fetchall():
        tree.topics[key].members.append(memory_id)
        tree.leaf_of[memory_id] = key
    tree.topics[ROOT].size = sum(tree.topics[c].size for c in tree.topics[ROOT].children)
    return tree


def save_namespaces(con, tree: Tree, namespaces: Iterable[str]) -> None:
    """Replace the stored subtrees (topics and tree membership) of ``namespaces``.

    Runs inside the caller's transaction.
    """
    namespaces = sorted(set(namespaces))
    if not namespaces:
        return
    con.execute("DELETE FROM topics WHERE list_contains(?, namespace) OR topic_key = ?", [namespaces, ROOT])
    con.execute(
        "DELETE FROM memory_topics WHERE kind IN ('leaf', 'ancestor') AND memory_id IN "
        "(SELECT id FROM memories WHERE list_contains(?, namespace))",
        [namespaces],
    )
    keys = [ROOT] + [k for ns in namespaces for k in tree.namespace_keys(ns)]
    topics = [tree.topics[k] for k in keys]
    con.execute(
        "INSERT INTO topics SELECT * FROM (SELECT unnest(?) AS k, unnest(?) AS p, unnest(?) AS n, "
        "unnest(?) AS d, unnest(?) AS l, unnest(?) AS c, unnest(?) AS s, unnest(?) AS lb)",
        [
            [t.key for t in topics],
            [t.parent for t in topics],
            [t.namespace for t in topics],
            [t.depth for t in topics],
            [t.is_leaf for t in topics],
            [t.centroid.tolist() if t.centroid is not None else None for t in topics],
            [t.size for t in topics],
            [t.label for t in topics],
        ],
    )
    mids, tkeys, kinds = [], [], []
    for t in topics:
        if not t.is_leaf:
            continue
        path = tree.path_to(t.key)
        for mid in t.members:
            for depth, key in enumerate(path):
                mids.append(mid)
                tkeys.append(key)
                kinds.append("leaf" if depth == 0 else "ancestor")
    if mids:
        con.execute(
            "INSERT INTO memory_topics SELECT unnest(?), unnest(?), unnest(?)", [mids, tkeys, kinds]
        )


def drop_stale_words(tree: Tree, namespaces: Iterable[str], text_of: Callable[[str], str]) -> list[str]:
    """Rename the topics of ``namespaces`` whose label (the start of the key,
    made of typical words of the members' texts, ``Tree._new_key``) holds a
    word that no memory below the topic holds any more (``text_of(id)``: its
    text), leaving that word out; the rest of the key stays. A forgotten
    memory's words leave the keys this way, without clustering again.
    Returns the namespaces whose topics were renamed."""
    words: dict[str, set[str]] = {}

    def held(mid: str) -> set[str]:
        if mid not in words:
            words[mid] = set(_WORD.findall(text_of(mid).lower()))
        return words[mid]

    changed = set()
    for ns in sorted(set(namespaces)):
        for key in tree.namespace_keys(ns):
            topic = tree.topics[key]
            if key == namespace_key(ns) or not key.startswith(topic.label + "-"):
                continue
            terms = topic.label.split("-")
            below = _members_below(tree, key)
            kept = [t for t in terms if any(t in held(m) for m in below)]
            label = "-".join(kept) or "topic"
            if label == topic.label:
                continue
            new, rest, n = label + key[len(topic.label):], key[len(topic.label):], 2
            while new in tree.topics:
                new, n = f"{label}{rest}-{n}", n + 1
            _rename(tree, key, new, label)
            changed.add(ns)
    return sorted(changed)


def _members_below(tree: Tree, key: str) -> list[str]:
    out, stack = [], [key]
    while stack:
        topic = tree.topics[stack.pop()]
        out.extend(topic.members)
        stack.extend(topic.children)
    return out


def _rename(tree: Tree, old: str, new: str, label: str) -> None:
    topic = tree.topics.pop(old)
    topic.key, topic.label = new, label
    tree.topics[new] = topic
    if topic.parent is not None:
        kids = tree.topics[topic.parent].children
        kids[kids.index(old)] = new
        kids.sort()  # children stay sorted by key: ties in descent go to the smaller one
    for child in topic.children:
        tree.topics[child].parent = new
    for mid in topic.members:
        tree.leaf_of[mid] = new
