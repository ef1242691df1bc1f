"""The segment store: the store of earlier versions, read only to migrate it.

Up to the version before the lake, a store was an immutable, indexed
**base** (a DuckDB file with the tree and the full-text index) plus small
immutable **delta** segments, named by one JSON file, ``MANIFEST``::

    data_dir/MANIFEST                   {"version", "base", "deltas", "next_seq"}
    data_dir/segments/base-00000007.duckdb
    data_dir/segments/delta-00000009.json   memories, tombstones, full-text terms
    data_dir/segments/delta-00000009.npy    their embeddings (float32, row order)

A store written before segments existed (``CURRENT`` naming
``generations/store-N.duckdb``, or ``store.duckdb``) reads as a base without
deltas.

This dimple writes none of it. It reads the manifest and deltas
(``pipeline.store.reader.read_segments``) for ``dimple migrate``, which copies
the store into the lake, and refuses to open a data dir holding one that is
not migrated (``refuse_unmigrated``). Its writers took two ``flock`` locks,
``WRITE.lock`` (manifest changes) and ``COMPACT.lock`` (one compaction at a
time); ``migrate`` holds both while it copies, so an earlier dimple still
running on the store waits instead of writing under it.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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
    # (their files stayed until the next compaction), for readers still on that base
    compacted_base: str | None = None
    consumed: list[DeltaRef] = field(default_factory=list)
    # set by a compaction that erased forgotten memories: the deltas it merged are gone
    erased: bool = False
    # seqs of deltas published while an erasing compaction ran
    erase_pending: list[int] = field(default_factory=list)
    # [write id, version] of the last writes that gave one (a broker message's task id)
    recent_writes: list[list[Any]] = field(default_factory=list)

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
    """A ``StoreError`` naming ``dimple migrate`` when ``data_dir`` holds a
    segment store (the store of earlier versions) that is not all in the lake:
    never migrated (no ``MIGRATED`` marker), or written since its migrate (the
    manifest's version or base past the marker's: an earlier version of dimple
    wrote it again). Reads two small files (or a name or two): cheap enough for
    every open."""
    if not exists(data_dir):
        return
    manifest = read_manifest(data_dir)
    assert manifest is not None
    marker = migrated(data_dir)
    if marker is not None:
        then = (marker.get("segment_version"), marker.get("segment_base"))
        if then == (manifest.version, manifest.base):
            return
        raise StoreError(f"{data_dir} holds a segment store ({MANIFEST}, version {manifest.version}) written after "
                         f"'dimple migrate' copied version {then[0]} into the lake: run 'dimple migrate' again to "
                         "copy what changed")
    found = (f"a segment store ({MANIFEST}, version {manifest.version})" if (data_dir / MANIFEST).exists()
             else f"a segment store from before segments ({manifest.base})")
    raise StoreError(f"{data_dir} holds {found}, the store of earlier versions, that is not in the lake yet: run "
                     "'dimple migrate' to copy it there")


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
    """The lock an earlier dimple's writers took for each manifest change."""
    busy = f"waited {wait_s} s for another write to {data_dir} to finish"
    with _flock(data_dir / "WRITE.lock", wait_s, busy):
        yield


@contextmanager
def compact_lock(data_dir: Path, wait: bool = False) -> Iterator[bool]:
    """The lock an earlier dimple's compactions took: yields False at once when
    one runs, unless ``wait``."""
    with _flock(data_dir / "COMPACT.lock", None if wait else 0, "") as held:
        yield held


def read_delta(data_dir: Path, ref: DeltaRef) -> tuple[dict[str, Any], np.ndarray]:
    """A published delta's JSON and embeddings (FileNotFoundError if a compaction removed it)."""
    body = json.loads((data_dir / ref.file).read_text(encoding="utf-8"))
    vectors = np.load(data_dir / _npy(ref.file), allow_pickle=False)
    if body.get("format") != FORMAT or body.get("seq") != ref.seq or len(vectors) != len(body.get("memories", ())):
        raise StoreError(f"delta {ref.file} does not match its manifest entry")
    return body, vectors
