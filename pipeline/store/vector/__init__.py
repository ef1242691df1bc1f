"""The vector leg's data side, and its face: what other packages may use.

``tree`` (building the topic tree: clustering, insertion, storing it),
``index`` (``VectorIndex``: one base's tree and embeddings in memory),
``descent`` (the beam descent, exact search, the deltas' exact scores, and
the loops it runs: ``Kernels``), ``kernels`` (those loops compiled by numba,
imported only by ``Kernels.compile``) and ``router`` (``TreeRouter``: the
leaf a new memory goes to until compaction).
"""

from pipeline.store.vector.descent import KERNELS, Kernels, compile_kernels, delta_hits, descend, exact
from pipeline.store.vector.index import VectorIndex
from pipeline.store.vector.router import TreeRouter
from pipeline.store.vector.tree import ROOT, Tree, drop_stale_words, load_tree, namespace_key, save_namespaces

__all__ = [
    "KERNELS", "ROOT", "Kernels", "TreeRouter", "Tree", "VectorIndex", "compile_kernels", "delta_hits", "descend",
    "drop_stale_words", "exact", "load_tree", "namespace_key", "save_namespaces",
]
