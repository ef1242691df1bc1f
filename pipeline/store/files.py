"""Files made durable and removed: the fsyncs after a base or a marker is
written (a file, then its folder, so a crash leaves the old name or the new,
whole), and the removal of a DuckDB file with its WAL."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_file(path: Path) -> None:
    """Remove a DuckDB file with its WAL, or a folder (a build's spill folder)."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    path.with_name(path.name + ".wal").unlink(missing_ok=True)
