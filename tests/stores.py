"""Test helpers for reading a store's (the lake's) files after writes."""

from __future__ import annotations

from pathlib import Path

from pipeline.store.lake.follow import bases
from pipeline.store.lake.store import Lake
from pipeline.store.maintenance import compact


def compacted(settings) -> Path:
    """Compact (as ``dimple compact`` does) and return the newest base's path:
    the file then holds everything written (the base built at the lake's
    latest snapshot)."""
    compact(settings, wait=True)
    built = bases(settings)
    assert built
    return built[max(built)]


def published(settings) -> tuple[int, tuple]:
    """The store's version and everything a write could change: the lake's
    latest snapshot and the names of its data files."""
    with Lake.open(settings) as lake:
        return lake.latest_snapshot(), tuple(sorted(str(p) for p in lake.data_path.rglob("*") if p.is_file()))
