"""Test helpers for reading a store's files after writes."""

from __future__ import annotations

from pathlib import Path

from pipeline.store import segments
from pipeline.store.compact import compact


def compacted(settings) -> Path:
    """Merge every delta into the base (as ``dimple compact`` does) and return
    the base's path: the file then holds everything written."""
    compact(settings, wait=True)
    path = segments.base_path(settings.data_dir)
    assert path is not None
    return path


def published(settings) -> tuple:
    """Everything a write could change: the manifest's text and every segment file's name and bytes."""
    folder = settings.data_dir / segments.SEGMENTS
    files = sorted((p.name, p.read_bytes()) for p in folder.iterdir()) if folder.is_dir() else []
    return (settings.data_dir / segments.MANIFEST).read_text(), files
