"""Test helpers for reading a store's files after writes, on either engine."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.store import segments
from pipeline.store.lake.follow import bases
from pipeline.store.lake.store import Lake
from pipeline.store.maintenance import compact


def compacted(settings) -> Path:
    """Compact (as ``dimple compact`` does) and return the newest base's path:
    the file then holds everything written (on the lake, the base built at the
    latest snapshot)."""
    compact(settings, wait=True)
    if settings.store.engine == "lake":
        built = bases(settings)
        assert built
        return built[max(built)]
    path = segments.base_path(settings.data_dir)
    assert path is not None
    return path


def published(settings) -> tuple[int, tuple]:
    """The store's version and everything a write could change: on the lake
    its latest snapshot and the names of its data files; on the segment store
    the manifest's version, and its text with every segment file's name and bytes."""
    if settings.store.engine == "lake":
        with Lake.open(settings) as lake:
            return lake.latest_snapshot(), tuple(sorted(str(p) for p in lake.data_path.rglob("*") if p.is_file()))
    folder = settings.data_dir / segments.SEGMENTS
    files = sorted((p.name, p.read_bytes()) for p in folder.iterdir()) if folder.is_dir() else []
    manifest = (settings.data_dir / segments.MANIFEST).read_text()
    return json.loads(manifest)["version"], (manifest, tuple(files))
