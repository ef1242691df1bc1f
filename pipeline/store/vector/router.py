"""Routing a new memory: the leaf of the base's tree (and that leaf's
ancestors) an insertion would choose, as a delta memory's topics until a
compaction places it for good (``pipeline.store.vector.tree``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.store.vector.tree import ROOT, namespace_key, topic_rows


class TreeRouter:
    """The base tree's centroids, to give a delta memory the leaf (and its
    ancestors) an insertion would choose, as its topics until compaction."""

    def __init__(self, rows: list[tuple[str, str | None, bool, Any]]):
        self.parent: dict[str, str | None] = {}
        self.children: dict[str, list[str]] = {}
        self.centroid: dict[str, np.ndarray] = {}
        self.leaf: set[str] = set()
        for key, parent, is_leaf, centroid in rows:
            self.parent[key] = parent
            if parent is not None:
                self.children.setdefault(parent, []).append(key)
            if centroid is not None:
                self.centroid[key] = np.asarray(centroid, dtype=np.float32)
            if is_leaf:
                self.leaf.add(key)
        for kids in self.children.values():
            kids.sort()
        self._matrix: dict[str, tuple[list[str], np.ndarray]] = {}

    @classmethod
    def load(cls, con) -> TreeRouter:
        """The router of the base read through ``con`` (its reader keeps one per base)."""
        return cls(topic_rows(con, "SELECT topic_key, parent, is_leaf, centroid FROM topics"))

    def _kids(self, key: str) -> tuple[list[str], np.ndarray]:
        """A topic's children (sorted by key) and their centroids as one matrix, built once."""
        cached = self._matrix.get(key)
        if cached is None:
            kids = self.children[key]
            cached = (kids, np.stack([self.centroid[c] for c in kids]).astype(np.float32))
            self._matrix[key] = cached
        return cached

    def route(self, namespace: str, vector: np.ndarray) -> list[str]:
        key = namespace_key(namespace)
        if key not in self.parent:
            return []
        while key not in self.leaf and self.children.get(key):
            kids, matrix = self._kids(key)
            # nearest child; ties go to the smaller key (argmax takes the first, kids are sorted), as in insert
            key = kids[int(np.argmax(matrix @ vector))]
        path = []
        node: str | None = key
        while node is not None and node != ROOT:
            path.append(node)
            node = self.parent.get(node)
        return path
