"""``ops.bench.latency``'s query blocks: on the demo store every side asks the
same queries; on a synthetic store each block is new, so no side is answered
from what an earlier side's same queries read."""

from __future__ import annotations

import pytest

from ops.bench.latency import Queries


def _pool(n: int) -> list[dict]:
    return [{"text": f"q{i}"} for i in range(n)]


def test_synthetic_blocks_are_new_queries_each_time():
    blocks = Queries(_pool(10), repeat=False)
    first, second, third = blocks.take(3), blocks.take(3), blocks.take(4)
    texts = [q["text"] for q in first + second + third]
    assert len(set(texts)) == 10  # no query in two blocks
    assert [q["i"] for q in first + second + third] == list(range(10))  # each its place in the pool
    with pytest.raises(AssertionError, match="smaller than the blocks"):
        blocks.take(1)


def test_demo_blocks_repeat_the_same_queries():
    blocks = Queries(_pool(5), repeat=True)
    assert blocks.take(3) == blocks.take(3) == [{"text": f"q{i}", "i": i} for i in range(3)]
