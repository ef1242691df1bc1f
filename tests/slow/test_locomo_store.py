"""LoCoMo end to end with the real model (slow tier; needs ../shared/data).

Ingest 5,882 turns (the ``locomo_store`` fixture of conftest.py, built once per
session), check the store's shape, and check that beam descent keeps the seed's
bound while finding what exact cosine search finds.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.contracts import Scope
from pipeline.store.database import Store
from pipeline.store.stats import store_stats
from pipeline.store.vector import VectorIndex, descend, exact
from tests.stores import compacted

pytestmark = pytest.mark.slow


def test_locomo_ingest_then_stats(locomo_store):
    settings, _ = locomo_store
    with Store.open(compacted(settings), read_only=True) as store:
        stats = store_stats(store)
    assert stats["memories"] == 5882
    assert stats["namespaces"] == 10
    assert stats["tree"]["memories_in_leaves"] == 5882
    assert stats["tree"]["largest_leaf"] <= settings.tree.max_leaf_items
    assert stats["fts"]["fresh"] is True


def test_descent_is_bounded_and_matches_exact_search(locomo_store):
    from pipeline.embedders import make_embedder

    settings, loco = locomo_store
    queries = loco.queries[::3]  # 512 questions spread over all conversations
    vectors = make_embedder(settings).embed([q["text"] for q in queries])
    with Store.open(compacted(settings), read_only=True) as store:
        index = VectorIndex.load(store.con, store.generation, store.info.embedding_dim)
    bound = settings.tree.beam_width * settings.tree.max_leaf_items
    recalls = []
    for q, vec in zip(queries, vectors):
        scope = Scope(namespace=q["namespace"])
        hits, profile = descend(index, vec, index.start_topics(scope), beam_width=settings.tree.beam_width,
                                max_depth=settings.tree.max_depth, top_k=10)
        assert profile["memories_scored"] <= bound
        assert all(h.split(":")[0] == q["namespace"] for h, _ in hits)
        ref = {h for h, _ in exact(index, vec, scope, 10)}
        recalls.append(len({h for h, _ in hits} & ref) / len(ref))
    assert float(np.mean(recalls)) >= 0.95
