"""The LoCoMo loader, on a tiny hand-built file (and, when present, the real one).

The tests of this concern for the slow tier (CI runs it; the default tier does not); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_locomo.py``.
"""

from __future__ import annotations

import pytest

from pipeline.datasets.locomo import load_locomo
from tests.unit.test_locomo import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    REAL,
    fixture_path,
)


@pytest.mark.slow
def test_real_locomo10() -> None:
    if not REAL.is_file():
        pytest.skip(f"LoCoMo data not available at {REAL}")
    got = load_locomo(REAL)
    assert len(got.records) == 5882
    assert len({r["namespace"] for r in got.records}) == 10
    assert len({r["id"] for r in got.records}) == 5882
    # 1,986 questions - 446 adversarial - 4 with an empty evidence list.
    assert got.skipped["adversarial"] == 446
    assert got.skipped["no_evidence"] == 4
    assert got.skipped["unknown_evidence_only"] == 0
    assert len(got.queries) == 1536 == len(got.qrels)
    known = {r["id"] for r in got.records}
    assert all(rel and set(rel) <= known for rel in got.qrels.values())
