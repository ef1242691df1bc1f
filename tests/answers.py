"""A query's answer as the tests compare it across paths (embedded, through the
workers, through MCP): ids, order, ranks and links exactly, the fused score
within float32 precision.

Why not exactly: the default fusion (convex) adds the legs' scores themselves,
not only their ranks, and the query vector is computed in another process (the
embed worker, with its own thread count), so a cosine may differ in its last
float32 bit (seen: 0.540539338 against 0.540539351); min-max normalisation
divides that by the query's score range, so the bound is absolute (seen: a
difference of 3.6e-8 on a fused score of 0.0297)."""

from __future__ import annotations

import math

SCORE_TOL = 1e-6  # float32 carries ~7 significant digits; a real difference in fusion is far larger


class Score(float):
    """A fused score: equal to another within ``SCORE_TOL``."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (int, float)) and math.isclose(self, other, rel_tol=SCORE_TOL, abs_tol=SCORE_TOL)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = float.__hash__
