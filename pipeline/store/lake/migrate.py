"""``dimple migrate``: a data dir's segment store (``pipeline.store.segments``,
the store of earlier versions) copied into the lake (docs/LAKE.md, issue 34
item 7).

A data dir that holds a segment store (``MANIFEST``, or a pre-segment
``store.duckdb``) and no ``MIGRATED`` marker is refused on open
(``segments.refuse_unmigrated``: every reader the settings make, the CLI's
commands), naming the command to run: no silent rebuild, and no lake that
quietly lacks the memories the user wrote.

``migrate`` reads every live memory of the segment store at its current
version as its own readers did (``reader.read_segments``: base + deltas, so
forgotten memories, replacements and links are exactly what a search saw:
``writes.records_of``) and commits them to the lake as one
``LakeWrite`` per batch of ids (sorted), embeddings as stored (nothing is
embedded again). Write ids are ``migrate-<state>-b<size>-<batch>``, ``state``
naming the segment store's version: a migrate stopped halfway and run again
skips the batches the lake holds and commits the rest (a commit of a batch
already there is a replay, applied once). Then it builds the lake's first
base at the last batch's snapshot (as the lake's first write does: the first
search does not wait for it) and writes ``MIGRATED`` in the data dir.

A segment store written after its migrate (an earlier dimple wrote it
again) is refused on open as one never migrated is; ``migrate`` then
copies what changed since: each memory copied is kept as a digest of its
record and embedding (``DIGESTS``), and only memories new or changed since,
and the forgets, are committed (write ids of the new state: resumable too).
A memory written to the lake meanwhile stays, unless the segment store
wrote the same id (the segment store's write is copied over it). At its end
``migrate`` reads the manifest again: a store that moved during the copy (a
writer that did not take its locks) is refused, and no marker is written.

Nothing of the segment store is deleted: ``MANIFEST``, ``segments/`` and the
lock files stay until the operator removes them (``segments.STORE_FILES``).
Forgotten memories are not carried over: the reader does not return them,
nor any link to one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.embedders import check_model, model_identity
from pipeline.errors import InputError, StoreError
from pipeline.settings import Settings
from pipeline.store import files, segments
from pipeline.store.database import utcnow
from pipeline.store.ingest import MemoryRecord
from pipeline.store.lake.catalog import one
from pipeline.store.lake.commit import snapshot_of_write
from pipeline.store.lake.follow import Follower
from pipeline.store.lake.records import LakeMemory, LakeWrite
from pipeline.store.lake.store import Lake
from pipeline.store.reader import Snapshot, read_segments
from pipeline.store.writes import records_of

# Memories per lake commit: one catalog transaction and one Parquet file per
# table each; at 1,000 a batch of 384-d embeddings is ~1.5 MB, and a 1M store
# is 1,000 commits.
BATCH_SIZE = 1000
MARKER_FORMAT = 1
# Beside MIGRATED: each memory a migrate copied, as a digest of its record and
# embedding, so that a migrate of a segment store written since copies only
# what changed (read by migrate only; never by an open).
DIGESTS = "MIGRATED.digests"


@dataclass
class Marker:
    """What ``MIGRATED`` records: the segment store's state that was copied and where it went."""

    segment_version: int
    segment_base: str | None
    snapshot: int
    memories: int
    batches: int
    catalog: str
    data_path: str
    migrated_at: str
    format: int = MARKER_FORMAT

    @classmethod
    def read(cls, data_dir: Path) -> Marker | None:
        data = segments.migrated(data_dir)
        if data is None:
            return None
        try:
            if data.get("format") != MARKER_FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise StoreError(f"{data_dir / segments.MIGRATED} is not a migrate marker this dimple reads: "
                             f"{exc}") from None

    def write(self, data_dir: Path) -> None:
        """Written whole, fsynced and renamed into place: a reader sees it or not, never half."""
        tmp = data_dir / f"{segments.MIGRATED}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(self), indent=1, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, data_dir / segments.MIGRATED)
        files.fsync_dir(data_dir)


@dataclass
class BatchDone:
    """One batch, as ``migrate`` reports it to ``on_batch``."""

    index: int  # from 1
    total: int
    memories: int
    snapshot: int
    attempts: int


@dataclass
class MigrateReport:
    memories: int = 0  # live memories of the segment store, now in the lake
    batches: int = 0
    batch_size: int = 0  # memories per batch: the size asked for, or the one a resumed run began with
    resumed: int = 0  # batches an earlier, stopped run had committed (not written again)
    snapshot: int = 0  # the lake snapshot holding every batch (with memories: the listing of the base built there)
    seconds: float = 0.0
    segment_version: int = 0
    base: str | None = None  # the base built at ``snapshot`` (None: no memories)
    already: bool = False  # the data dir was migrated before: nothing done
    caught_up: bool = False  # the segment store was written after its migrate: only what changed was copied
    changed: int = 0  # memories written to the lake (new or replaced since the last migrate, when caught up)
    forgotten: int = 0  # memories forgotten in the segment store since the last migrate, forgotten in the lake
    marker: Marker | None = None


def _state(manifest: segments.Manifest) -> str:
    """A short name for the segment store's state: a write or compaction in between changes it."""
    text = json.dumps([manifest.version, manifest.base, manifest.next_seq])
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def write_id(state: str, size: int, index: int) -> str:
    return f"migrate-{state}-b{size}-{index:06d}"


def migrate(settings: Settings, *, batch_size: int = BATCH_SIZE,
            on_batch: Callable[[BatchDone], None] | None = None) -> MigrateReport:
    """Copy the live memories of ``settings.data_dir``'s segment store into the
    lake ``settings`` name (``store.catalog``, ``store.data_path``), resuming a
    migrate that stopped; then mark the data dir migrated. A segment store
    written after its migrate is caught up: only the memories that changed
    since (new, replaced, forgotten; ``DIGESTS``) are written. ``on_batch`` is
    told of each batch committed (progress; a test stops the run there).

    Refused (``StoreError``): no segment store in the data dir; the lake already holds memories it did not get from this
    migrate (a first migrate); the segment store moved while it was copied. A
    second run over an unchanged, migrated store does nothing (``already``)."""
    t0 = time.perf_counter()
    data_dir = settings.data_dir
    if batch_size < 1:
        raise InputError("batch_size", f"at least 1 memory per commit, not {batch_size}")
    if not segments.exists(data_dir):
        raise StoreError(f"nothing to migrate: no segment store in {data_dir} (no {segments.MANIFEST}, no "
                         f"{segments.LEGACY_FILE})")
    snap: Snapshot | None = None
    try:
        # the segment store holds still while it is copied: the writers and compactions of an
        # earlier dimple still running on it wait (they take these locks)
        with segments.compact_lock(data_dir, wait=True), segments.write_lock(data_dir, wait_s=settings.write_wait_s):
            read = read_segments(data_dir)
            if read is None:
                raise StoreError(f"nothing to migrate: no segment store in {data_dir}")
            manifest, snap = read
            done = Marker.read(data_dir)
            if done is not None and (done.segment_version, done.segment_base) == (manifest.version, manifest.base):
                return MigrateReport(memories=done.memories, batches=done.batches, snapshot=done.snapshot,
                                     segment_version=done.segment_version, already=True, marker=done,
                                     seconds=time.perf_counter() - t0)
            overlay = snap.overlay
            base_ids = ([r[0] for r in snap.store.con.execute("SELECT id FROM memories").fetchall()]
                        if snap.store is not None else [])
            ids = sorted({m for m in base_ids if m not in overlay.touched} | set(overlay.members))
            if snap.store is not None:
                model, dim = snap.store.info.embedding_model, snap.store.info.embedding_dim
            else:  # deltas over no base (not written by dimple, but readable): their vectors say the dimension
                model, dim = model_identity(settings.embedding_model), int(overlay.emb.shape[1])
            configured = model_identity(settings.embedding_model)
            check_model(model, dim, configured, None, f"the segment store in {data_dir}")
            if model == "unknown":
                model = configured
            state = _state(manifest)
            with Lake.open(settings, embedding_model=model, embedding_dim=dim) as lake:
                if done is None:
                    size, committed = _resumable(lake, state, batch_size, data_dir)
                    before: dict[str, str] | None = None
                else:  # written after its migrate: what changed since goes
                    size, committed = _ours(lake, state, batch_size)
                    before = _digests_then(data_dir, done, lake)
                digests: dict[str, str] = {}
                if before is None:  # every memory, digested as its batch is copied
                    todo, gone = ids, []
                else:  # a first pass digests every memory; the batches below copy the changed ones
                    for i in range(0, len(ids), size):
                        digests.update((m, _digest(r, v)) for m, r, v in _read(settings, snap, ids[i:i + size]))
                    todo = [m for m in ids if before.get(m) != digests[m]]
                    gone = sorted(set(before) - set(ids))
                chunks = [todo[i:i + size] for i in range(0, len(todo), size)] or ([[]] if gone else [])
                report = MigrateReport(memories=len(ids), batches=len(chunks), batch_size=size,
                                       segment_version=manifest.version, caught_up=before is not None,
                                       changed=len(todo), forgotten=len(gone))
                last = None
                for index, chunk in enumerate(chunks, start=1):
                    wid = write_id(state, size, index)
                    last = wid
                    if wid in committed and before is not None:
                        report.resumed += 1
                        continue
                    got = _read(settings, snap, chunk)
                    if before is None:
                        digests.update((m, _digest(r, v)) for m, r, v in got)
                    if wid in committed:
                        report.resumed += 1
                        continue
                    now = utcnow()
                    write = LakeWrite([LakeMemory.from_record(r, v, now) for _, r, v in got],
                                      forget=gone if index == len(chunks) else [], write_id=wid)
                    result = lake.commit(write)
                    if on_batch is not None:
                        on_batch(BatchDone(index, len(chunks), len(chunk), result.snapshot, result.attempts))
                if last is not None:
                    report.snapshot = snapshot_of_write(lake.con, last)
                    held = lake.count(at=report.snapshot)
                    if before is None and held != len(ids):
                        raise StoreError(f"the lake holds {held} memories at snapshot {report.snapshot}, not the "
                                         f"{len(ids)} of the segment store: another process wrote to it meanwhile")
                else:
                    report.snapshot = lake.latest_snapshot()
                catalog, data_path = str(lake.catalog), str(lake.data_path)
            # the segment store's vector index is no longer needed: the base build reads the lake whole
            snap.close()
            snap = None
            if ids and before is None:
                follower = Follower(settings)
                try:
                    # the base's listing is a snapshot of its own: the migrate's version, as the
                    # lake's first write's version is its listing (the snapshot a reader reaches)
                    base, report.snapshot = follower.build_after_write(report.snapshot)
                    report.base = str(base) if base is not None else None
                finally:
                    follower.close()
            moved = segments.read_manifest(data_dir)
            if moved is None or _state(moved) != state:
                # a writer that did not take the store's locks (another host, where flock does not reach)
                raise StoreError(f"the segment store in {data_dir} moved while it was copied (version "
                                 f"{manifest.version} then, {moved.version if moved else None} now): run "
                                 "'dimple migrate' again to copy what changed")
            _write_digests(data_dir, manifest.version, digests)
            report.marker = Marker(segment_version=manifest.version, segment_base=manifest.base,
                                   snapshot=report.snapshot, memories=len(ids), batches=len(chunks), catalog=catalog,
                                   data_path=data_path, migrated_at=utcnow().isoformat() + "Z")
            report.marker.write(data_dir)
    finally:
        if snap is not None:
            snap.close()
    report.seconds = time.perf_counter() - t0
    return report


def _read(settings: Settings, snap: Snapshot, ids: list[str]) -> list[tuple[str, MemoryRecord, np.ndarray]]:
    """The live memories ``ids`` (sorted): id, record and stored embedding (as ``reembed`` reads them)."""
    if not ids:
        return []  # a catch-up that only forgets
    got = [MemoryRecord.model_validate(r) for r in records_of(snap, ids)]
    if [r.id for r in got] != ids:
        raise StoreError(f"the segment store in {settings.data_dir} changed while it was read")
    return list(zip(ids, got, _embeddings(snap, ids), strict=True))


def _digest(record: MemoryRecord, vector: np.ndarray) -> str:
    """What a memory was when copied: its record and embedding's bytes, hashed."""
    h = hashlib.blake2b(digest_size=12)
    h.update(json.dumps(record.model_dump(mode="json"), sort_keys=True).encode())
    h.update(np.ascontiguousarray(vector, dtype=np.float32).tobytes())
    return h.hexdigest()


def _write_digests(data_dir: Path, version: int, digests: dict[str, str]) -> None:
    """``DIGESTS``: each memory copied, as it was (written whole before the marker names the version)."""
    tmp = data_dir / f"{DIGESTS}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"segment_version": version, "digests": digests}, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, data_dir / DIGESTS)
    files.fsync_dir(data_dir)


def _digests_then(data_dir: Path, done: Marker, lake: Lake) -> dict[str, str]:
    """The memories the last migrate copied, by digest: ``DIGESTS`` when it is
    that migrate's, else (a marker written before it was kept) the lake as the
    migrate left it, at the marker's snapshot."""
    try:
        data = json.loads((data_dir / DIGESTS).read_text(encoding="utf-8"))
        if data.get("segment_version") == done.segment_version:
            return dict(data["digests"])
    except FileNotFoundError:
        pass
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{data_dir / DIGESTS} is not what 'dimple migrate' wrote: {exc}") from None
    try:
        return {m.id: _digest(m.record(), m.embedding) for m in lake.read(at=done.snapshot)}
    except InputError:
        raise StoreError(f"the lake no longer holds snapshot {done.snapshot}, where the last migrate of {data_dir} "
                         "left it (store.retain, or an erase since), and no record of what it copied: start again "
                         f"into an empty lake (remove {data_dir / segments.MIGRATED} and the lake)") from None


def _ours(lake: Lake, state: str, batch_size: int) -> tuple[int, set[str]]:
    """The batch size and write ids of this catch-up the lake holds (one that stopped)."""
    ours = [r[0] for r in lake.con.execute("SELECT write_id FROM writes WHERE starts_with(write_id, ?)",
                                           [f"migrate-{state}-"]).fetchall()]
    sizes = {int(w.split("-b", 1)[1].split("-", 1)[0]) for w in ours}
    return (min(sizes) if sizes else batch_size), set(ours)


def _resumable(lake: Lake, state: str, batch_size: int, data_dir: Path) -> tuple[int, set[str]]:
    """The batch size to use and the write ids of this migrate the lake holds
    (a run that stopped: its batches, at its batch size). Refused when the lake
    holds memories any other write put there."""
    ours = [r[0] for r in lake.con.execute("SELECT write_id FROM writes WHERE starts_with(write_id, ?)",
                                           [f"migrate-{state}-"]).fetchall()]
    held = lake.count()
    if held:
        others = one(lake.con.execute("SELECT count(*), min(write_id) FROM writes WHERE NOT starts_with(write_id, ?)",
                                  [f"migrate-{state}-"])) or (0, None)
        if others[0] or not ours:
            earlier = " (an earlier migrate of this segment store at another version)" \
                if others[1] is not None and str(others[1]).startswith("migrate-") else ""
            present = " ".join(f for f in segments.STORE_FILES if (data_dir / f).exists())
            raise StoreError(f"the lake at {lake.catalog} already holds {held} memor{'y' if held == 1 else 'ies'} "
                             f"written by other writes{earlier}: 'dimple migrate' fills an empty lake. Point "
                             "store.catalog and store.data_path at a new one, or remove that lake first; or, if "
                             f"that lake is the one to keep, move the segment store out of {data_dir} ({present})")
    sizes = {int(w.split("-b", 1)[1].split("-", 1)[0]) for w in ours}
    if len(sizes) > 1:
        raise StoreError(f"the lake holds batches of this migrate of several sizes ({sorted(sizes)}): start again "
                         "into an empty lake")
    return (sizes.pop() if sizes else batch_size), set(ours)


def _embeddings(snap: Snapshot, ids: list[str]) -> np.ndarray:
    """The stored embeddings of the live memories ``ids``, in order: a delta's
    from the overlay, else the base's from its vector index (the rows the
    vector leg scores, read once for the whole store)."""
    overlay = snap.overlay
    index = snap.index() if any(m not in overlay.members for m in ids) else None
    rows = []
    for mid in ids:
        if mid in overlay.members:
            rows.append(overlay.emb[overlay.row_of[mid]])
        elif index is not None and mid in index.row_of:
            rows.append(index.emb[index.row_of[mid]])
        else:
            raise StoreError(f"memory {mid!r}: no embedding in the segment store")
    return np.stack(rows).astype(np.float32)
