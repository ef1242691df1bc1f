"""The host cache (docs/LAKE.md, "The host cache"): one copy per host of a
base's large immutable arrays, which every process of the host
memory-maps instead of reading its own.

A base's folder (``<data dir>/cache/<base name>/``, given by its reader)
holds one folder per part: ``vector`` (``VectorIndex``: the embeddings by
leaf, ``read_parts`` of ``pipeline.store.vector.index``), ``postings``
(``Postings``: the CSR arrays and the per-memory columns) and ``graph``
(``GraphPart``: each memory's row, topics and concepts and the edges, by id,
for ``search.augment``). A part holds one
``.npy`` file per array, ``lists.json`` (the ids, terms and labels, which a
process holds as Python objects) and ``manifest.json``: the base file it
was read from (name, bytes, modification time) and each file's bytes and
SHA-256.

The first process of the host to need a part reads it from the base file,
writes it into a folder of its own and renames that folder into place: a
reader never sees half a part. Processes that need a missing part at once
(a prefork worker's children start together) take turns on a lock file
beside it (``<part>.lock``, ``flock``: released when its holder ends, also
by a kill): the first reads and writes, the others then map what it
wrote instead of each reading a copy of their own (at 1M, ~1.5 GB each).
Past ``BUILD_WAIT_S`` a process stops waiting and reads its own; of two
renames one wins, the other drops its copy and opens the winner's. Every process
checks a part against its manifest before it maps it (every byte hashed:
about 0.7 GB/s, so 2.6 s for 1M memories of 384 dimensions, once per
process and base); a part that does not match (a partial or damaged file,
or another base file of the same name) is moved aside, deleted and
written again, never served. Arrays are opened with
``numpy.load(mmap_mode="r")``: read-only, backed by the kernel's page
cache, which holds one copy for every process. On POSIX a part deleted
while a process has it mapped stays readable to that process.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import StoreError
from pipeline.folders import private_dir
from pipeline.store.fulltext.postings import Postings
from pipeline.store.fulltext.postings import read_parts as read_postings
from pipeline.store.graph import GraphPart
from pipeline.store.graph import read_parts as read_graph
from pipeline.store.vector.index import VectorIndex
from pipeline.store.vector.index import read_parts as read_vectors

log = logging.getLogger("dimple.hostcache")

FORMAT = 1
MANIFEST = "manifest.json"
LISTS = "lists.json"
# A temporary folder this old was left by a process that died writing it.
STALE_S = 3600.0
# How long a process waits for another to write a part before reading its own
# (a 1M base's parts take ~20-30 s to read and write on two busy cores).
BUILD_WAIT_S = 600.0

Parts = tuple[dict[str, np.ndarray], dict[str, list]]


class HostCache:
    """The host cache folder of one base file: its parts, written once and
    memory-mapped (the module's doc)."""

    def __init__(self, folder: Path, source: Path):
        self.folder = Path(folder)
        stat = Path(source).stat()
        self.source = {"name": Path(source).name, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        self.read: list[str] = []  # the parts this process read from the base file (it found the others whole)
        self.written: list[str] = []  # those of them its rename put in place (another process's won the rest)

    def vector_index(self, con: Any, generation: int, dim: int) -> VectorIndex:
        """The base's ``VectorIndex`` over memory-mapped arrays (``con`` reads the base when the part is missing)."""
        return VectorIndex.from_parts(generation, *self.part("vector", lambda: read_vectors(con, dim)))

    def postings(self, con: Any) -> Postings:
        """The base's ``Postings`` over memory-mapped arrays (``con`` reads the base when the part is missing)."""
        return Postings.from_parts(*self.part("postings", lambda: read_postings(con)))

    def graph(self, con: Any) -> GraphPart:
        """The base's ``GraphPart`` over memory-mapped arrays (``con`` reads the base when the part is missing)."""
        return GraphPart(*self.part("graph", lambda: read_graph(con)))

    def part(self, name: str, read: Callable[[], Parts]) -> Parts:
        """The part ``name``: opened when the host holds it whole, else read
        with ``read``, written and opened (the copy in this process's memory
        is dropped: what it serves is the mapped one)."""
        target = self.folder / name
        opened = self._open(target)
        if opened is not None:
            return opened
        with self._turn(name):
            return self._read_and_write(name, target, read)

    @contextmanager
    def _turn(self, name: str) -> Iterator[None]:
        """Hold the part's lock file (waiting up to ``BUILD_WAIT_S`` for a
        process writing it); without it when it cannot be had (the cache is an
        economy: this process then reads its own copy)."""
        fd = None
        try:
            private_dir(self.folder)
            fd = os.open(self.folder / f"{name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            deadline = time.monotonic() + BUILD_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        log.warning("the host cache's %s is still being written by another process after %.0f s: "
                                    "this process reads its own", self.folder / name, BUILD_WAIT_S)
                        break
                    time.sleep(0.05)
        except OSError as exc:
            log.warning("the host cache's lock for %s could not be taken (%s)", self.folder / name, exc)
        try:
            yield
        finally:
            if fd is not None:
                os.close(fd)  # releases the lock

    def _read_and_write(self, name: str, target: Path, read: Callable[[], Parts]) -> Parts:
        parts: Parts | None = None
        for _ in range(3):
            opened = self._open(target)
            if opened is not None:
                return opened
            self.read.append(name)
            parts = read()
            try:
                self._write(target, *parts)
            except OSError as exc:  # e.g. another process swept the base's folder meanwhile
                log.warning("the host cache's %s could not be written (%s): this process keeps its own copy",
                            target, exc)
                return parts
        if parts is not None:  # written, and gone or damaged again at once: the cache is an economy, not a need
            log.warning("the host cache's %s could not be read back whole: this process keeps its own copy", target)
            return parts
        raise StoreError(f"the host cache's {target} could not be written and read back whole")

    def _open(self, target: Path) -> Parts | None:
        """The part at ``target`` mapped (None: absent, or moved aside for not matching its manifest)."""
        try:
            manifest = json.loads((target / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            return self._discard(target, f"its manifest cannot be read ({exc})")
        if manifest.get("format") != FORMAT or manifest.get("source") != self.source:
            return self._discard(target, f"it was written from another base file ({manifest.get('source')})")
        files = manifest.get("files", {})
        for file, want in files.items():
            got = _describe(target / file) if (target / file).is_file() else None
            if got != want:
                return self._discard(target, f"{file} is {got}, its manifest says {want}")
        try:
            arrays = {a: np.asarray(np.load(target / f"{a}.npy", mmap_mode="r", allow_pickle=False))
                      for a in manifest["arrays"]}
            lists = json.loads((target / LISTS).read_text(encoding="utf-8"))
        except (OSError, ValueError, KeyError) as exc:
            return self._discard(target, f"it cannot be opened ({exc})")
        return arrays, lists

    def _write(self, target: Path, arrays: dict[str, np.ndarray], lists: dict[str, list]) -> None:
        """Write the part into a folder of this process's, then rename it to ``target`` (unless one is there)."""
        private_dir(target.parent)
        work = target.parent / f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(mode=0o700)
        try:
            for name, array in arrays.items():
                np.save(work / f"{name}.npy", np.ascontiguousarray(array), allow_pickle=False)
            (work / LISTS).write_text(json.dumps(lists), encoding="utf-8")
            files = {p.name: _describe(p) for p in sorted(work.iterdir())}
            manifest = {"format": FORMAT, "source": self.source, "arrays": sorted(arrays), "files": files}
            (work / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")  # last: a part is whole with it
            try:
                os.rename(work, target)
            except OSError:
                return  # another process's part took the name first: it is opened and checked instead
            self.written.append(target.name)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _discard(self, target: Path, why: str) -> Parts | None:
        """Move ``target`` aside (one rename: no process opens it after) and delete it; None (not opened)."""
        log.warning("the host cache's %s is written again: %s", target, why)
        remove(target)
        return None


def _describe(path: Path) -> dict[str, Any]:
    """A file's size and SHA-256 (read in blocks, through the page cache, not mapped)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}


def remove(path: Path) -> None:
    """Delete a cache folder: renamed aside first, so no process finds it half deleted."""
    gone = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.gone")
    try:
        os.rename(path, gone)
    except FileNotFoundError:
        return
    except OSError:
        shutil.rmtree(gone, ignore_errors=True)  # a leftover of ours by that name: cleared, tried once more
        try:
            os.rename(path, gone)
        except OSError:
            return
    shutil.rmtree(gone, ignore_errors=True)


def sweep(root: Path, keep: Callable[[str], bool]) -> list[str]:
    """Delete the base folders under ``root`` that ``keep`` (given a folder's
    name) refuses, and temporary folders older than ``STALE_S`` (a process
    died writing them); the names deleted."""
    if not root.is_dir():
        return []
    gone = []
    now = time.time()
    for path in sorted(root.iterdir()):
        if path.name.startswith("."):
            try:
                stale = now - path.stat().st_mtime > STALE_S
            except FileNotFoundError:
                continue
            if stale:
                shutil.rmtree(path, ignore_errors=True)
        elif path.is_dir() and not keep(path.name):
            remove(path)
            gone.append(path.name)
    return gone
