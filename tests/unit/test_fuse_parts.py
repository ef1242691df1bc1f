"""``search.fuse`` leaves the legs' batches it was given as they were (the
in-process runner keeps each stage's output; ``merge_legs`` copies only what
merging and fusing change)."""

from __future__ import annotations

from datetime import datetime

from pipeline.stages.fuse import fuse_batch
from tests.unit.test_fuse import _parts


def test_fusing_leaves_the_parts_as_they_were():
    parts = _parts()
    for s in parts[0].states + parts[1].states:
        s.query.options.recency_boost = 1.0  # recency too
        for leg in s.legs.values():
            leg.hits = leg.hits * 8  # more than fusion keeps (TOP_HITS)
    before = [p.model_copy(deep=True) for p in parts]
    out = fuse_batch(parts, 60, lambda ids: {i: datetime(2025, 1, 1) for i in ids})
    assert all(s.fused and s.legs["vector"].hit_count == 8 for s in out.states)
    out.states[0].timings["augment"] = 1.0  # later stages change the fused batch, not the parts
    out.states[0].query.vector = [0.5]
    assert parts == before
