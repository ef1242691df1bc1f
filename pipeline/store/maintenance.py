"""The store's compaction, whichever engine ``store.engine`` names: the
segment store's (``pipeline.store.compact``: merge the deltas into a new base)
or the lake's (``pipeline.store.lake.compaction``: flush, merge, expire or
erase, a base at the latest snapshot). What ``dimple compact``, ``dimple
reindex``, ``ingest.compact`` and a write past a threshold run.

Apart from both: the lake's modules build their bases with the segment
store's ``fresh_base``, so ``compact`` cannot name the lake's module itself.
"""

from __future__ import annotations

from pipeline.settings import Settings
from pipeline.store.compact import CompactReport
from pipeline.store.compact import compact as compact_segments
from pipeline.store.lake.compaction import compact_lake


def compact(settings: Settings, *, rebuild: bool = False, wait: bool = False) -> CompactReport:
    """Compact the store ``settings`` name (``rebuild``: every namespace
    clustered again; without ``wait``, ``ran`` False at once when another
    compaction runs)."""
    if settings.store.engine == "lake":
        return compact_lake(settings, wait=wait, rebuild=rebuild)
    return compact_segments(settings, rebuild=rebuild, wait=wait)
