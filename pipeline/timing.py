"""Stage timing: every figure in ``timings`` and in the audit row is measured
the same way, on the monotonic high-resolution clock, in milliseconds."""

from __future__ import annotations

import time


def ms_since(t0: float) -> float:
    """Milliseconds since ``t0`` (a ``time.perf_counter()`` reading), to the microsecond."""
    return round((time.perf_counter() - t0) * 1000, 3)
