"""Augment carries only the candidates the budget can keep: after scope and budget
the answer is exactly what carrying every candidate gives.

The tests of this concern for the in-process canvas (the embedded tier); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_augment.py``.
"""

from __future__ import annotations

from pipeline.contracts import Batch
from pipeline.stages.augment import augment_batch
from pipeline.stages.budget import budget_batch
from pipeline.stages.scope import scope_batch
from pipeline.store.database import Store
from tests.unit.test_augment import _state  # noqa: F401  (helpers and fixtures shared with the unit tests)


def test_candidates_past_max_units_are_counted_not_carried(embedded, tmp_path):
    """Hand-worked: 5 candidates in scope, max_units 2 -> 2 carried, 3 counted,
    and the budget reports all 3 as left out."""
    import json

    from pipeline.embedders import HashEmbedder
    from pipeline.store import ingest

    records = [{"id": f"m{i}", "namespace": "a", "content": f"deploy item{i}"} for i in range(5)]
    records.append({"id": "x", "namespace": "b", "content": "deploy elsewhere"})
    # a DuckDB store file of its own (as a base holds the memories), outside the data dir
    store = Store.open(tmp_path / "base.duckdb", read_only=False, embedding_model="hash-64", embedding_dim=64)
    parsed = ingest.parse_lines([json.dumps(r) for r in records], embedded.limits)
    ingest.ingest_records(store, parsed.records, HashEmbedder(64), embedded)
    try:
        order = ["m0", "x", "m1", "m2", "m3", "m4"]
        state = _state({"namespace": "a"}, {"max_units": 2, "max_chars": None, "timed_out": False}, order)
        out = augment_batch(Batch(states=[state]), store.cursor(), 40).states[0]
        assert [r.id for r in out.results] == ["m0", "x", "m1"]  # x is left to the scope stage
        assert out.beyond_budget == 3
        final = budget_batch(scope_batch(Batch(states=[out]))).states[0]
        assert [r.id for r in final.results] == ["m0", "m1"]
        assert final.scope_dropped == 1
        assert final.truncated and final.truncation.by == "maxUnits" and final.truncation.left_out == 3
    finally:
        store.close()
