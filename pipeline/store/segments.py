"""Segments: how writers and many reading processes share a store.

A store is an immutable, indexed **base** (a DuckDB file with the tree and the
full-text index) plus small immutable **delta** segments, named by one JSON
file, ``MANIFEST``, that is replaced atomically::

    data_dir/MANIFEST                   {"version", "base", "deltas", "next_seq"}
    data_dir/segments/base-00000007.duckdb
    data_dir/segments/delta-00000009.json   memories, tombstones, full-text terms
    data_dir/segments/delta-00000009.npy    their embeddings (float32, row order)

A write (``pipeline.store.writes``) writes one delta and publishes a manifest
that lists it: its cost is the size of the write. Compaction
(``pipeline.store.compact``) merges the deltas into a new base in the
background and publishes a manifest that names the new base and the deltas
written meanwhile. Readers read ``MANIFEST`` before each task and load only
what is new (``pipeline.store.overlay``).

DuckDB locks a file across processes (DESIGN.md), so no file is ever written
after it is published: a base is built under a fresh name, a delta is written
whole before the manifest names it. Publishing fsyncs the data, the new
manifest and the directory, so an acknowledged write survives a crash, and a
writer killed before the rename leaves the previous manifest in force.

Two locks (``flock``): ``WRITE.lock`` serialises manifest changes (held for
one delta write, or for the swap at the end of a compaction); ``COMPACT.lock``
lets one compaction run at a time. Writers wait for ``WRITE.lock`` rather
than being refused. A store written before segments existed (``CURRENT``
naming ``generations/store-N.duckdb``, or ``store.duckdb``) is read as a base
without deltas.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import StoreError

MANIFEST = "MANIFEST"
SEGMENTS = "segments"
LEGACY_CURRENT = "CURRENT"
LEGACY_FILE = "store.duckdb"
FORMAT = 1
# written by ``dimple migrate`` (pipeline.store.lake.migrate) once the lake holds this store
MIGRATED = "MIGRATED"
# what a segment store is made of, relative to the data dir (the legacy names
# only in stores from before segments): what an operator removes once migrated
STORE_FILES = (MANIFEST, SEGMENTS, "WRITE.lock", "COMPACT.lock", LEGACY_FILE, LEGACY_CURRENT, "generations")
RECENT_WRITES = 256  # write ids a manifest remembers: a redelivery after this many later writes applies again
_BASE = re.compile(r"^base-(\d{8})\.duckdb(\.work)?(\.wal)?$")  # .work: a compaction killed midway
_DELTA = re.compile(r"^delta-(\d{8})\.(json|npy)$")


@dataclass
class DeltaRef:
    """A delta as the manifest lists it."""

    seq: int
    file: str  # the JSON file, relative to the data dir; embeddings beside it (.npy)
    memories: int = 0
    forgotten: int = 0


@dataclass
class Manifest:
    version: int = 0
    base: str | None = None  # relative to the data dir
    deltas: list[DeltaRef] = field(default_factory=list)
    next_seq: int = 1
    # set by a compaction: the base it started from and the deltas it merged
    # (their files stay until the next compaction), so a reader still on that
    # base can go on answering from it with every write while it loads the new one
    compacted_base: str | None = None
    consumed: list[DeltaRef] = field(default_factory=list)
    # set by a compaction that erased forgotten memories: the deltas it merged
    # held them (text and tombstones), so their files go at once, not at the
    # next compaction; a reader still on ``compacted_base`` that had not read
    # them all loads the new base instead (``Reader._follow``)
    erased: bool = False
    # seqs of deltas published while an erasing compaction ran: they were
    # routed to the old base's topic keys, which may hold a forgotten word, so
    # the compaction that merges them erases too (``compact``)
    erase_pending: list[int] = field(default_factory=list)
    # [write id, version] of the last RECENT_WRITES writes that gave one (a
    # broker message's task id): a message delivered again after its write
    # was published is not applied twice (``note_write``)
    recent_writes: list[list[Any]] = field(default_factory=list)

    def applied(self, write_id: str | None) -> int | None:
        """The version that published write ``write_id``, or None when it is not among the recent ones."""
        if write_id is None:
            return None
        return next((v for w, v in self.recent_writes if w == write_id), None)

    def note_write(self, write_id: str | None) -> None:
        """Record that this manifest's version published ``write_id``."""
        if write_id is not None:
            self.recent_writes = [*self.recent_writes, [write_id, self.version]][-RECENT_WRITES:]

    @property
    def delta_memories(self) -> int:
        return sum(d.memories for d in self.deltas)

    def as_json(self) -> str:
        data = {"format": FORMAT, **asdict(self)}
        for key in ("erased", "erase_pending"):
            if not data[key]:
                del data[key]  # a manifest an earlier dimple still reads
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    def files(self) -> set[str]:
        """Every file this manifest needs (relative names)."""
        refs = self.deltas + ([] if self.erased else self.consumed)
        out = {d.file for d in refs} | {_npy(d.file) for d in refs}
        if self.base is not None:
            out.add(self.base)
        return out


def _npy(json_file: str) -> str:
    return json_file[: -len(".json")] + ".npy"


def read_manifest(data_dir: Path) -> Manifest | None:
    """The published manifest, or None when nothing was ever written.

    A store from before segments reads as a base without deltas (version 0).
    """
    path = data_dir / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        legacy = _legacy_base(data_dir)
        return Manifest(base=legacy) if legacy is not None else None
    try:
        data = json.loads(text)
        if data.pop("format", None) != FORMAT:
            raise ValueError("unknown format")
        deltas = [DeltaRef(**d) for d in data.pop("deltas")]
        consumed = [DeltaRef(**d) for d in data.pop("consumed", [])]
        return Manifest(deltas=deltas, consumed=consumed, **data)
    except (ValueError, TypeError, KeyError) as exc:
        raise StoreError(f"{path} is not a manifest this dimple reads: {exc}") from None


def _legacy_base(data_dir: Path) -> str | None:
    try:
        name = (data_dir / LEGACY_CURRENT).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return LEGACY_FILE if (data_dir / LEGACY_FILE).exists() else None
    return name if (data_dir / name).exists() else None


def base_path(data_dir: Path) -> Path | None:
    """The published base file, or None when there is none."""
    manifest = read_manifest(data_dir)
    if manifest is None or manifest.base is None:
        return None
    return data_dir / manifest.base


def store_path(data_dir: Path) -> Path:
    """The published base, or where a first one would be (``LEGACY_FILE``)."""
    return base_path(data_dir) or data_dir / LEGACY_FILE


def exists(data_dir: Path) -> bool:
    """Whether a store was ever published here (a base, or deltas only)."""
    manifest = read_manifest(data_dir)
    return manifest is not None and (manifest.base is not None or bool(manifest.deltas))


def migrated(data_dir: Path) -> dict[str, Any] | None:
    """The ``MIGRATED`` marker ``dimple migrate`` wrote (its JSON), or None."""
    path = data_dir / MIGRATED
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise StoreError(f"{path} is not a migrate marker this dimple reads: {exc}") from None
    if not isinstance(data, dict):
        raise StoreError(f"{path} is not a migrate marker this dimple reads: not a JSON object")
    return data


def refuse_unmigrated(data_dir: Path) -> None:
    """For the lake engine (``store.engine = lake``): a ``StoreError`` naming
    ``store.engine`` and ``dimple migrate`` when ``data_dir`` holds a segment
    store that is not all in the lake: never migrated (no ``MIGRATED``
    marker), or written since its migrate (the manifest's version or base
    past the marker's: someone ran with the segment engine again). Reads two
    small files (or a name or two): cheap enough for every open."""
    if not exists(data_dir):
        return
    manifest = read_manifest(data_dir)
    assert manifest is not None
    marker = migrated(data_dir)
    if marker is not None:
        then = (marker.get("segment_version"), marker.get("segment_base"))
        if then == (manifest.version, manifest.base):
            return
        raise StoreError(f"store.engine: {data_dir} holds a segment store ({MANIFEST}, version {manifest.version}) "
                         f"written after 'dimple migrate' copied version {then[0]} into the lake: run 'dimple "
                         "migrate' again (with DIMPLE_STORE__ENGINE=lake) to copy what changed, or set "
                         "DIMPLE_STORE__ENGINE=segments to go on using it")
    found = (f"a segment store ({MANIFEST}, version {manifest.version})" if (data_dir / MANIFEST).exists()
             else f"a segment store from before segments ({manifest.base})")
    raise StoreError(f"store.engine: {data_dir} holds {found} that is not in the lake yet: run 'dimple migrate' "
                     "(with DIMPLE_STORE__ENGINE=lake) to copy it there, or set DIMPLE_STORE__ENGINE=segments to go "
                     "on using it")


# -- durability ------------------------------------------------------------------
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


def _write_durably(path: Path, data: bytes) -> None:
    """``data`` at ``path`` (a new name), fsynced; the directory is the caller's to fsync."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def publish(data_dir: Path, manifest: Manifest) -> None:
    """Make ``manifest`` the store's state: written, fsynced, renamed over
    ``MANIFEST``, directory fsynced. Call with ``WRITE.lock`` held."""
    tmp = data_dir / (MANIFEST + ".tmp")
    _write_durably(tmp, manifest.as_json().encode("utf-8"))
    os.replace(tmp, data_dir / MANIFEST)
    fsync_dir(data_dir)


# -- locks -----------------------------------------------------------------------
@contextmanager
def _flock(path: Path, wait_s: float | None, busy: str) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path``; wait up to ``wait_s`` (None:
    forever; 0: not at all, yielding False when it is held elsewhere)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "a+") as fh:
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    if wait_s == 0:
                        yield False
                        return
                    raise StoreError(busy) from None
                time.sleep(0.005)
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def write_lock(data_dir: Path, wait_s: float | None = None) -> Iterator[None]:
    """Serialises manifest changes across processes; waits its turn."""
    busy = f"waited {wait_s} s for another write to {data_dir} to finish"
    with _flock(data_dir / "WRITE.lock", wait_s, busy):
        yield


@contextmanager
def compact_lock(data_dir: Path, wait: bool = False) -> Iterator[bool]:
    """One compaction at a time: yields False at once when another one runs,
    unless ``wait``."""
    with _flock(data_dir / "COMPACT.lock", None if wait else 0, "") as held:
        yield held


# -- deltas ----------------------------------------------------------------------
def segments_dir(data_dir: Path) -> Path:
    folder = data_dir / SEGMENTS
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def write_delta(data_dir: Path, seq: int, payload: dict[str, Any], vectors: np.ndarray) -> DeltaRef:
    """Write delta ``seq`` (its JSON and its embeddings), fsynced, not yet published."""
    folder = segments_dir(data_dir)
    name = f"delta-{seq:08d}"
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    with open(folder / f"{name}.npy", "wb") as fh:
        np.save(fh, vectors, allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())
    body = {"format": FORMAT, "seq": seq, **payload}
    _write_durably(folder / f"{name}.json", json.dumps(body, ensure_ascii=False).encode("utf-8"))
    fsync_dir(folder)
    return DeltaRef(seq=seq, file=f"{SEGMENTS}/{name}.json", memories=len(payload.get("memories", ())),
                    forgotten=len(payload.get("forget", ())))


def read_delta(data_dir: Path, ref: DeltaRef) -> tuple[dict[str, Any], np.ndarray]:
    """A published delta's JSON and embeddings (FileNotFoundError if compaction removed it)."""
    body = json.loads((data_dir / ref.file).read_text(encoding="utf-8"))
    vectors = np.load(data_dir / _npy(ref.file), allow_pickle=False)
    if body.get("format") != FORMAT or body.get("seq") != ref.seq or len(vectors) != len(body.get("memories", ())):
        raise StoreError(f"delta {ref.file} does not match its manifest entry")
    return body, vectors


def new_base_path(data_dir: Path, seq: int) -> Path:
    return segments_dir(data_dir) / f"base-{seq:08d}.duckdb"


def remove_file(path: Path) -> None:
    """Remove a segment file with its DuckDB WAL, or a compaction's spill folder."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    path.with_name(path.name + ".wal").unlink(missing_ok=True)


def remove_unreferenced(data_dir: Path, keep: Manifest) -> list[str]:
    """Delete segment files ``keep`` does not need, and the pre-segment
    generations. Call with ``WRITE.lock`` held, after publishing ``keep``.

    A reader holding a removed base open keeps reading it (POSIX unlink)
    until its new base is loaded; one that read the old manifest and had not
    opened the file yet reads the manifest again. Files of a write in
    progress are never seen here: writes hold ``WRITE.lock`` from allocating
    their number to publishing.
    """
    needed = keep.files()
    removed = []
    folder = data_dir / SEGMENTS
    if folder.is_dir():
        for path in folder.iterdir():
            rel = f"{SEGMENTS}/{path.name}"
            if rel in needed or not (_BASE.match(path.name) or _DELTA.match(path.name)):
                continue
            number = int(re.findall(r"\d{8}", path.name)[0])
            if number < keep.next_seq:
                remove_file(path)
                removed.append(rel)
    for legacy in (LEGACY_FILE, LEGACY_CURRENT):
        if legacy not in needed and (data_dir / legacy).exists():
            (data_dir / legacy).unlink()
            removed.append(legacy)
    generations = data_dir / "generations"
    if generations.is_dir():
        for path in generations.iterdir():
            if f"generations/{path.name}" not in needed:
                path.unlink(missing_ok=True)
                removed.append(f"generations/{path.name}")
    return removed


def drop_all(data_dir: Path) -> None:
    """Remove the manifest and every segment (a store rebuilt from nothing)."""
    with write_lock(data_dir):
        (data_dir / MANIFEST).unlink(missing_ok=True)
        (data_dir / LEGACY_CURRENT).unlink(missing_ok=True)
        (data_dir / LEGACY_FILE).unlink(missing_ok=True)
        shutil.rmtree(data_dir / SEGMENTS, ignore_errors=True)
        shutil.rmtree(data_dir / "generations", ignore_errors=True)
