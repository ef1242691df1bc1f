"""Store generations: how one writer and many reading processes share a store.

DuckDB locks a file across processes: a read-write open blocks every reader
and the reverse (DESIGN.md). So the writer never writes a file that readers
have open. It copies the current generation to a new file, writes there, and
publishes it by atomically replacing ``CURRENT`` (a one-line text file).
Readers look at ``CURRENT`` before each task (a file read, microseconds) and
switch when it changed: an acknowledged write is visible to the next task.

Old generations are deleted after publishing, except the previous one, so a
reader that read ``CURRENT`` just before the switch can still open it; a
reader holding a deleted file keeps reading it (POSIX unlink semantics) until
it switches. One writer at a time is enforced with an exclusive ``flock``.

A write costs a whole-file copy, so its delay grows with the store (figures
in BENCHMARKS.md, "Ingest freshness"); a small delta beside a base compacted
in the background (an LSM shape) would keep it flat.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.errors import StoreError

CURRENT = "CURRENT"
LEGACY = "store.duckdb"
_GEN = re.compile(r"^store-(\d{8})\.duckdb$")


def generation_files(data_dir: Path) -> list[tuple[int, Path]]:
    out = []
    folder = data_dir / "generations"
    if folder.is_dir():
        for path in folder.iterdir():
            match = _GEN.match(path.name)
            if match:
                out.append((int(match.group(1)), path))
    return sorted(out)


def current(data_dir: Path) -> Path | None:
    """The published store file, or None when nothing was ever written."""
    pointer = data_dir / CURRENT
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        legacy = data_dir / LEGACY
        return legacy if legacy.exists() else None
    path = data_dir / name
    return path if path.exists() else None


def current_or_default(data_dir: Path) -> Path:
    """The published store, or where a first store would be written."""
    return current(data_dir) or data_dir / LEGACY


@contextmanager
def writer_lock(data_dir: Path) -> Iterator[None]:
    """Exclusive across processes: one writer per data dir."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(data_dir / "WRITER.lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"another process is writing to {data_dir}; try again when it is done") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def writing(data_dir: Path) -> Iterator[Path]:
    """A new generation to write, published when the block succeeds.

    The new file starts as a copy of the current one (or does not exist yet
    for a first store). On any error it is removed and nothing is published.
    """
    with writer_lock(data_dir):
        folder = data_dir / "generations"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        existing = generation_files(data_dir)
        number = (existing[-1][0] + 1) if existing else 1
        target = folder / f"store-{number:08d}.duckdb"
        source = current(data_dir)
        if source is not None:
            shutil.copyfile(source, target)
        try:
            yield target
        except BaseException:
            for path in (target, target.with_name(target.name + ".wal")):
                path.unlink(missing_ok=True)
            raise
        publish(data_dir, target)


def publish(data_dir: Path, target: Path) -> None:
    """Point ``CURRENT`` at ``target`` atomically, then drop old generations."""
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp = data_dir / (CURRENT + ".tmp")
    tmp.write_text(str(target.relative_to(data_dir)) + "\n", encoding="utf-8")
    os.replace(tmp, data_dir / CURRENT)
    legacy = data_dir / LEGACY
    if legacy.exists() and legacy != target:
        legacy.unlink()
    keep = {target}
    files = generation_files(data_dir)
    if len(files) >= 2:
        keep.add(files[-2][1] if files[-1][1] == target else files[-1][1])
    for _, path in files:
        if path not in keep:
            path.unlink(missing_ok=True)


def drop_all(data_dir: Path) -> None:
    """Remove every generation and the pointer (a store rebuilt from nothing)."""
    with writer_lock(data_dir):
        (data_dir / CURRENT).unlink(missing_ok=True)
        (data_dir / LEGACY).unlink(missing_ok=True)
        shutil.rmtree(data_dir / "generations", ignore_errors=True)
