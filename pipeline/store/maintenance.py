"""The store's compaction (``pipeline.store.lake.compaction``: flush, merge,
expire or erase, a base at the latest snapshot): what ``dimple compact``,
``dimple reindex``, ``ingest.compact`` and a write past a threshold run.

Apart from the lake's modules: they build their bases with
``pipeline.store.compact.fresh_base``, so ``compact`` cannot live there.
"""

from __future__ import annotations

from pipeline.settings import Settings
from pipeline.store.compact import CompactReport
from pipeline.store.lake.compaction import compact_lake


def compact(settings: Settings, *, rebuild: bool = False, wait: bool = False) -> CompactReport:
    """Compact the lake ``settings`` name (``rebuild``: every namespace
    clustered again; without ``wait``, ``ran`` False at once when another
    compaction runs)."""
    return compact_lake(settings, wait=wait, rebuild=rebuild)
