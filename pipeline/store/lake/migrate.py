"""``dimple migrate``: a data dir's segment store (``pipeline.store.segments``)
copied into the lake (docs/LAKE.md, issue 34 item 7).

With ``store.engine = lake``, a data dir that holds a segment store (``MANIFEST``,
or a pre-segment ``store.duckdb``) and no ``MIGRATED`` marker is refused on
open (``segments.refuse_unmigrated``: every reader the settings make, the
CLI's commands), naming ``store.engine`` and the command to run: no silent rebuild,
and no lake that quietly lacks the memories the user wrote.

``migrate`` reads every live memory of the segment store at its current
version through the segment store's own ``Reader`` (base + deltas, so
forgotten memories, replacements and links are exactly what a search sees:
``writes.get``, as ``reembed`` reads them) and commits them to the lake as one
``LakeWrite`` per batch of ids (sorted), embeddings as stored (nothing is
embedded again). Write ids are ``migrate-<state>-b<size>-<batch>``, ``state``
naming the segment store's version: a migrate stopped halfway and run again
skips the batches the lake holds and commits the rest (a commit of a batch
already there is a replay, applied once). Then it builds the lake's first
base at the last batch's snapshot (as the lake's first write does: the first
search does not wait for it) and writes ``MIGRATED`` in the data dir.

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
from pipeline.store import segments
from pipeline.store.database import utcnow
from pipeline.store.ingest import MemoryRecord
from pipeline.store.lake.commit import snapshot_of_write
from pipeline.store.lake.follow import Follower
from pipeline.store.lake.records import LakeMemory, LakeWrite
from pipeline.store.lake.store import Lake
from pipeline.store.reader import Reader, Snapshot
from pipeline.store.writes import get

# Memories per lake commit: one catalog transaction and one Parquet file per
# table each; at 1,000 a batch of 384-d embeddings is ~1.5 MB, and a 1M store
# is 1,000 commits.
BATCH_SIZE = 1000
MARKER_FORMAT = 1


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
        try:
            data = json.loads((data_dir / segments.MIGRATED).read_text(encoding="utf-8"))
            if data.get("format") != MARKER_FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            return cls(**data)
        except FileNotFoundError:
            return None
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
        segments.fsync_dir(data_dir)


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
    migrate that stopped; then mark the data dir migrated. ``on_batch`` is told
    of each batch committed (progress; a test stops the run there).

    Refused (``StoreError``): ``store.engine`` is not ``lake``; no segment store
    in the data dir; the lake already holds memories it did not get from this
    migrate; the segment store changed since a migrate began or finished. A
    second run over an unchanged, migrated store does nothing (``already``)."""
    t0 = time.perf_counter()
    data_dir = settings.data_dir
    if settings.store.engine != "lake":
        raise StoreError(f"store.engine: 'dimple migrate' copies the segment store into the lake that the lake engine "
                         f"reads (store.catalog, store.data_path): run it with DIMPLE_STORE__ENGINE=lake (now "
                         f"{settings.store.engine!r})")
    if batch_size < 1:
        raise InputError("batch_size", f"at least 1 memory per commit, not {batch_size}")
    if not segments.exists(data_dir):
        raise StoreError(f"nothing to migrate: no segment store in {data_dir} (no {segments.MANIFEST}, no "
                         f"{segments.LEGACY_FILE})")
    reader = Reader(data_dir)
    try:
        # the segment store holds still while it is copied: its writers and compactions wait
        with segments.compact_lock(data_dir, wait=True), segments.write_lock(data_dir, wait_s=settings.write_wait_s):
            manifest = segments.read_manifest(data_dir)
            snap = reader.snapshot()
            if manifest is None or snap is None:
                raise StoreError(f"nothing to migrate: no segment store in {data_dir}")
            done = Marker.read(data_dir)
            if done is not None:
                if (done.segment_version, done.segment_base) != (manifest.version, manifest.base):
                    raise StoreError(
                        f"the segment store in {data_dir} changed after it was migrated (version "
                        f"{done.segment_version} then, {manifest.version} now): those writes are not in the lake. "
                        f"Start again into an empty lake (remove {data_dir / segments.MIGRATED} and the lake: "
                        f"store.catalog, store.data_path), or remove the segment store if they do not matter")
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
                size, committed = _resumable(lake, state, batch_size, data_dir)
                chunks = [ids[i:i + size] for i in range(0, len(ids), size)]
                report = MigrateReport(memories=len(ids), batches=len(chunks), batch_size=size,
                                       segment_version=manifest.version)
                last = None
                for index, chunk in enumerate(chunks, start=1):
                    wid = write_id(state, size, index)
                    last = wid
                    if wid in committed:
                        report.resumed += 1
                        continue
                    records = [MemoryRecord.model_validate(r) for r in get(settings, chunk, reader)]
                    if [r.id for r in records] != chunk:
                        raise StoreError(f"the segment store in {data_dir} changed while it was read")
                    vectors = _embeddings(snap, chunk)
                    now = utcnow()
                    write = LakeWrite([LakeMemory.from_record(r, vectors[i], now) for i, r in enumerate(records)],
                                      write_id=wid)
                    result = lake.commit(write)
                    if on_batch is not None:
                        on_batch(BatchDone(index, len(chunks), len(chunk), result.snapshot, result.attempts))
                if last is not None:
                    report.snapshot = snapshot_of_write(lake.con, last)
                    held = lake.count(at=report.snapshot)
                    if held != len(ids):
                        raise StoreError(f"the lake holds {held} memories at snapshot {report.snapshot}, not the "
                                         f"{len(ids)} of the segment store: another process wrote to it meanwhile")
                else:
                    report.snapshot = lake.latest_snapshot()
                catalog, data_path = str(lake.catalog), str(lake.data_path)
            # the segment store's vector index is no longer needed: the base build reads the lake whole
            reader.close()
            del snap
            if ids:
                follower = Follower(settings)
                try:
                    # the base's listing is a snapshot of its own: the migrate's version, as the
                    # lake's first write's version is its listing (the snapshot a reader reaches)
                    base, report.snapshot = follower.build_listed(report.snapshot)
                    report.base = str(base)
                finally:
                    follower.close()
            report.marker = Marker(segment_version=manifest.version, segment_base=manifest.base,
                                   snapshot=report.snapshot, memories=len(ids), batches=len(chunks), catalog=catalog,
                                   data_path=data_path, migrated_at=utcnow().isoformat() + "Z")
            report.marker.write(data_dir)
    finally:
        reader.close()
    report.seconds = time.perf_counter() - t0
    return report


def _resumable(lake: Lake, state: str, batch_size: int, data_dir: Path) -> tuple[int, set[str]]:
    """The batch size to use and the write ids of this migrate the lake holds
    (a run that stopped: its batches, at its batch size). Refused when the lake
    holds memories any other write put there."""
    ours = [r[0] for r in lake.con.execute("SELECT write_id FROM writes WHERE starts_with(write_id, ?)",
                                           [f"migrate-{state}-"]).fetchall()]
    held = lake.count()
    if held:
        others = lake.con.execute("SELECT count(*), min(write_id) FROM writes WHERE NOT starts_with(write_id, ?)",
                                  [f"migrate-{state}-"]).fetchone() or (0, None)
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
