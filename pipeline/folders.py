"""Folders that hold memories, audit rows or their copies: owner-only."""

from __future__ import annotations

from pathlib import Path


def private_dir(path: Path) -> Path:
    """Make ``path`` and each missing folder above it 0o700 (the umask can
    only narrow that); ``mkdir(parents=True, mode=...)`` leaves the folders
    above at the umask's mode. Returns ``path``."""
    for folder in reversed([f for f in (path, *path.parents) if not f.exists()]):
        folder.mkdir(exist_ok=True, mode=0o700)
    return path
