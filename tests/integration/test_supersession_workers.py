"""Supersession (and fusion) on real workers: the option travels in the JSON query state
through Redis, and each value serves exactly what it serves embedded on the
demo store (whose supersession chains give promote and hide work to do)."""

from __future__ import annotations

import json

import pytest

from tests.answers import Score

pytestmark = pytest.mark.integration


def _key(res):
    return ([(r.id, Score(r.score), r.ranks, r.promoted_above, [l.id for l in r.superseded_by]) for r in res.results],
            res.hidden_superseded)


def test_each_supersession_value_on_workers_matches_embedded(demo_store, stack):
    import workers
    from workers.api import search_many

    lines = demo_store.files["queries"].read_text(encoding="utf-8").splitlines()
    queries = [json.loads(l) for l in lines if l.strip()]
    for value in ("annotate", "promote", "hide"):
        asks = [dict(query=q["text"], namespace=q.get("namespace"), supersession=value) for q in queries]
        workers.configure(demo_store.settings)
        embedded = search_many(asks, batch_size=32)
        workers.configure(demo_store.with_broker(stack.broker_url))
        distributed = search_many(asks, batch_size=32)
        assert [_key(r) for r in distributed] == [_key(r) for r in embedded], value
        promoted = sum(1 for res in distributed for r in res.results if r.promoted_above)
        hidden = sum(res.hidden_superseded for res in distributed)
        if value == "annotate":
            assert promoted == hidden == 0
        else:
            assert promoted > 0, value  # the demo's chains are found and their successors placed
            assert (hidden > 0) == (value == "hide")


def test_convex_fusion_on_workers_matches_embedded(demo_store, stack):
    """``fusion`` travels in the JSON query state too: convex on the workers
    serves what it serves embedded, and not what RRF serves."""
    import workers
    from workers.api import search_many

    lines = demo_store.files["queries"].read_text(encoding="utf-8").splitlines()
    asks = [dict(query=q["text"], namespace=q.get("namespace"), fusion="convex")
            for q in (json.loads(l) for l in lines if l.strip())]
    workers.configure(demo_store.settings)
    embedded = search_many(asks, batch_size=32)
    rrf = search_many([{**a, "fusion": "rrf"} for a in asks], batch_size=32)
    workers.configure(demo_store.with_broker(stack.broker_url))
    distributed = search_many(asks, batch_size=32)

    def order(res):  # convex scores are cosines and BM25 scores themselves: the workers' compiled
        return [(r.id, r.ranks, r.promoted_above) for r in res.results]  # dot products differ in the last bits

    assert [order(r) for r in distributed] == [order(r) for r in embedded]
    assert [r.score for res in distributed for r in res.results] == pytest.approx(
        [r.score for res in embedded for r in res.results], abs=1e-5)
    assert [order(r) for r in distributed] != [order(r) for r in rrf]
    assert all(0.0 <= r.score <= 1.0 for res in distributed for r in res.results)
