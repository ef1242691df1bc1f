"""``dimple migrate`` as a library (``pipeline.store.lake.migrate``): a segment
store written by today's write path (links of every kind, replacements,
forgets, a compaction part way, writes after it) copied into the lake answers
every query as the segment store does, ``get`` returns the same memories,
forgotten ones are in no file of the lake; a migrate stopped after some
batches and run again ends where an uninterrupted one does; what it refuses.

The history and the query comparison are test_lake_derive's."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import pipeline.embedders
from pipeline.embedders import HashEmbedder
from pipeline.errors import InputError, ModelMismatchError, StoreError
from pipeline.store import segments
from pipeline.store.compact import compact
from pipeline.store.database import utcnow
from pipeline.store.ingest import MemoryRecord
from pipeline.store.lake import Lake, LakeMemory, LakeWrite
from pipeline.store.lake.follow import bases, reader_for
from pipeline.store.lake.migrate import BatchDone, migrate
from pipeline.store.reader import Reader
from pipeline.store.segments import MIGRATED as MARKER
from pipeline.store.writes import LiveView, get, parse_records, write
from tests.lakes import files_holding
from tests.unit.test_lake_derive import DIM, History, Pinned, _settings, answers, assert_same_answers


def on_lake(settings):
    """The same data dir, read and written through the lake engine."""
    return settings.replace(store={**settings.store.model_dump(), "engine": "lake"})


def segment_store(settings, seed: int, first: int = 120, before: int = 12, after: int = 10):
    """A segment store written by the write path: a first batch (straight into a
    base), ``before`` random writes, a compaction, ``after`` more (left as deltas).
    Returns the history and every content each id was ever written with."""
    history = History(seed)
    texts: dict[str, list[str]] = {}

    def send(op: str, arg) -> None:
        if op == "forget":
            write(settings, forget=list(arg))
            return
        write(settings, parse_records(arg, settings))
        for rec in arg:
            texts.setdefault(rec["id"], []).append(rec["content"])

    send("remember", history.batch(first))
    for op, arg in history.writes(before):
        send(op, arg)
    compact(settings, wait=True)
    for op, arg in history.writes(after):
        send(op, arg)
    return history, texts


def segment_vectors(settings, ids: list[str]) -> np.ndarray:
    reader = Reader(settings.data_dir)
    try:
        live = LiveView(reader.snapshot())
        base = live.in_base(ids)
        return np.stack([live.overlay.emb[live.overlay.row_of[m]] if m in live.overlay.members else base[m][3]
                         for m in ids])
    finally:
        reader.close()


def migrated(settings, **kwargs):
    """``migrate``, which must embed nothing: the segment store's vectors are kept."""
    def refuse(*args, **kw):
        raise AssertionError("migrate embedded something")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline.embedders, "make_embedder", refuse)
        return migrate(settings, **kwargs)


def test_a_migrated_store_answers_every_query_as_the_segment_store_did(tmp_path):
    seg = _settings(tmp_path, "data")
    history, texts = segment_store(seg, seed=29)
    reader = Reader(seg.data_dir)
    theirs = reader.snapshot()
    assert theirs is not None and theirs.deltas and theirs.overlay.forgotten and theirs.overlay.dead_ids
    live = sorted(history.live)
    every = sorted(texts)
    before = get(seg, every, reader)
    kinds = {k for r in before for k in ("supersedes", "conflicts", "supported_by") if r[k]}
    assert kinds == {"supersedes", "conflicts", "supported_by"}
    assert any(len(t) > 1 for m, t in texts.items() if m in history.live), "a replacement"
    lake_settings = on_lake(seg)
    with pytest.raises(StoreError, match="^store.engine: .* holds a segment store .*'dimple migrate'"):
        segments.refuse_unmigrated(seg.data_dir)

    seen: list[BatchDone] = []
    report = migrated(lake_settings, batch_size=40, on_batch=seen.append)
    assert (report.memories, report.batches, report.resumed) == (len(live), -(-len(live) // 40), 0)
    assert [b.index for b in seen] == list(range(1, report.batches + 1))
    # a base built at the last batch's snapshot, listed by the next one: the migrate's version
    assert (seg.data_dir / MARKER).exists() and list(bases(lake_settings)) == [seen[-1].snapshot]
    assert report.snapshot == seen[-1].snapshot + 1
    segments.refuse_unmigrated(seg.data_dir)  # the lake opens now

    ours_reader = reader_for(lake_settings)
    try:
        ours = ours_reader.snapshot()
        assert ours is not None and ours.version == report.snapshot
        # ids, order, ranks, links; scores within 1e-12 (the lake's tree and full-text
        # numbering are built whole, the segment store's were updated in place)
        assert_same_answers(answers(Pinned(seg, theirs), seg), answers(Pinned(lake_settings, ours), lake_settings))
        assert get(lake_settings, every, ours_reader) == before  # forgotten ids left out on both
    finally:
        ours_reader.close()
        reader.close()

    with Lake.open(lake_settings) as lake:
        assert (lake.info.embedding_model, lake.info.embedding_dim) == (f"hash-{DIM}", DIM)
        held = lake.read()
        assert [m.id for m in held] == live
        assert np.array_equal(np.stack([m.embedding for m in held]), segment_vectors(seg, live))
        ends = lake.con.execute("SELECT list(src) || list(dst) || list(origin) FROM edges").fetchone()[0]
        assert ends and set(ends) <= set(live), "a link to a forgotten memory was carried over"
    # not one byte of a forgotten memory, nor of a replaced memory's old text, in the lake's files
    folders = (lake_settings.lake_data_path, seg.data_dir / "indexes", seg.data_dir / "lake.sqlite")
    gone = [t for m, ts in texts.items() for t in (ts if m not in history.live else ts[:-1])]
    assert len(gone) > 10 and history.forgotten
    assert files_holding(texts[live[0]][-1].encode(), *folders), "the scan finds a live memory's text"
    assert [t for t in gone if files_holding(t.encode(), *folders)] == []
    # nothing of the segment store was deleted
    assert segments.read_manifest(seg.data_dir) is not None and all(
        (seg.data_dir / f).exists() for f in segments.read_manifest(seg.data_dir).files())


def test_a_migrate_stopped_after_some_batches_resumes_to_the_same_lake(tmp_path):
    seg = _settings(tmp_path, "data")
    history, _ = segment_store(seg, seed=7, first=40, before=6, after=4)
    live = sorted(history.live)

    class Stop(Exception):
        pass

    def stop_after_two(done: BatchDone) -> None:
        if done.index == 2:
            raise Stop

    lake_settings = on_lake(seg)
    with pytest.raises(Stop):
        migrated(lake_settings, batch_size=12, on_batch=stop_after_two)
    assert not (seg.data_dir / MARKER).exists()
    with pytest.raises(StoreError, match="^store.engine: "):
        reader_for(lake_settings)  # still refused: half a store is not served
    with Lake.open(lake_settings) as lake:
        assert lake.count() == 24
    # run again, asking another batch size: it resumes at the size it began with
    report = migrated(lake_settings, batch_size=5)
    assert (report.resumed, report.memories, report.batch_size) == (2, len(live), 12)
    assert report.batches == -(-len(live) // 12)
    with Lake.open(lake_settings) as lake:
        held = lake.read()
        writes = [r[0] for r in lake.con.execute("SELECT write_id FROM writes ORDER BY 1").fetchall()]
        assert lake.count(at=report.snapshot) == len(held) == len(live)
    assert len(writes) == len(set(writes)) == report.batches  # each batch committed once
    # the lake holds what an uninterrupted migrate gives: the segment store's live memories as stored
    assert [m.id for m in held] == live
    assert [m.record().model_dump() for m in held] == [MemoryRecord.model_validate(r).model_dump()
                                                       for r in get(seg, live)]
    assert np.array_equal(np.stack([m.embedding for m in held]), segment_vectors(seg, live))


def test_what_a_migrate_refuses(tmp_path):
    seg = _settings(tmp_path, "data")
    with pytest.raises(StoreError, match="^nothing to migrate: no segment store in "):
        migrated(on_lake(seg))
    write(seg, parse_records([{"id": f"r{i}", "namespace": "n", "content": f"note {i} about redis"}
                              for i in range(5)], seg))
    with pytest.raises(StoreError, match="^store.engine: 'dimple migrate' .* DIMPLE_STORE__ENGINE=lake"):
        migrated(seg)
    with pytest.raises(InputError, match="^batch_size: "):
        migrated(on_lake(seg), batch_size=0)
    with pytest.raises(ModelMismatchError, match="^setting embedding_model: "):
        migrated(on_lake(seg).replace(embedding_model="hash-32"))

    # a lake that already holds memories (another store's) is not filled
    crowded = on_lake(seg).replace(store={"engine": "lake", "catalog": f"sqlite:{tmp_path / 'other.sqlite'}",
                                          "data_path": str(tmp_path / "other")})
    with Lake.open(crowded, embedding_model=f"hash-{DIM}", embedding_dim=DIM) as lake:
        record = parse_records({"id": "x", "namespace": "n", "content": "already here"}, seg).records[0]
        lake.commit(LakeWrite([LakeMemory.from_record(record, HashEmbedder(DIM).embed(["already here"])[0],
                                                      utcnow())]))
    with pytest.raises(StoreError, match=r"already holds 1 memory written by other writes.*move the segment "
                                         r"store out of .* \(MANIFEST segments"):
        migrated(crowded)
    with Lake.open(crowded) as lake:
        assert [m.id for m in lake.read()] == ["x"]
    assert not (seg.data_dir / MARKER).exists()

    done = migrated(on_lake(seg))
    assert done.memories == 5 and not done.already
    again = migrated(on_lake(seg))  # a second run: nothing to do
    assert again.already and again.snapshot == done.snapshot and again.memories == 5
    with Lake.open(on_lake(seg)) as lake:
        assert lake.count() == 5 and lake.latest_snapshot() == done.snapshot



def test_a_segment_store_written_after_its_migrate_is_refused_then_caught_up(tmp_path):
    seg = _settings(tmp_path, "data")
    write(seg, parse_records([{"id": f"r{i}", "namespace": "n", "content": f"note {i} about redis"}
                              for i in range(6)], seg))
    first = migrated(on_lake(seg))
    assert first.memories == 6 and not first.caught_up
    lake_settings = on_lake(seg)
    write(lake_settings, parse_records({"id": "lk", "namespace": "n", "content": "written on the lake"},
                                       lake_settings))
    # someone runs with the segment engine again: a new memory, a replacement, a forget
    write(seg, parse_records([{"id": "r6", "namespace": "n", "content": "a new note about redis"},
                              {"id": "r2", "namespace": "n", "content": "note 2, replaced"}], seg))
    write(seg, forget=["r1"])
    with pytest.raises(StoreError, match=r"^store.engine: .* written after 'dimple migrate' copied version 1 into "
                                         r"the lake: run 'dimple migrate' again"):
        segments.refuse_unmigrated(seg.data_dir)
    with pytest.raises(StoreError, match="^store.engine: "):
        reader_for(lake_settings)

    class Stop(Exception):
        pass

    def stop_at_first(done: BatchDone) -> None:
        raise Stop

    with pytest.raises(Stop):  # stopped after its first batch; resumed below
        migrated(lake_settings, batch_size=1, on_batch=stop_at_first)
    with pytest.raises(StoreError, match="^store.engine: "):
        segments.refuse_unmigrated(seg.data_dir)
    report = migrated(lake_settings, batch_size=7)
    assert report.caught_up and (report.changed, report.forgotten, report.memories) == (2, 1, 6)
    assert (report.resumed, report.batch_size, report.batches) == (1, 1, 2)
    segments.refuse_unmigrated(seg.data_dir)  # the lake opens again
    live = ["r0", "r2", "r3", "r4", "r5", "r6"]
    with Lake.open(lake_settings) as lake:
        held = {m.id: m for m in lake.read()}
        writes = [r[0] for r in lake.con.execute("SELECT write_id FROM writes").fetchall()]
    assert sorted(held) == sorted([*live, "lk"])  # the lake's own write stays
    assert held["r2"].content == "note 2, replaced"
    assert [held[m].record().model_dump() for m in live] == [MemoryRecord.model_validate(r).model_dump()
                                                             for r in get(seg, live)]
    assert np.array_equal(np.stack([held[m].embedding for m in live]), segment_vectors(seg, live))
    assert len(writes) == len(set(writes))  # each batch committed once
    assert migrated(lake_settings).already
    write(seg, forget=["r3"])  # a forget alone
    only = migrated(lake_settings)
    assert (only.changed, only.forgotten, only.batches) == (0, 1, 1)
    with Lake.open(lake_settings) as lake:
        assert sorted(m.id for m in lake.read()) == ["lk", "r0", "r2", "r4", "r5", "r6"]


def test_a_segment_store_that_moves_during_the_migrate_is_refused_unmarked(tmp_path):
    seg = _settings(tmp_path, "data")
    write(seg, parse_records([{"id": f"r{i}", "namespace": "n", "content": f"note {i} about redis"}
                              for i in range(6)], seg))

    def writer_without_the_lock(done: BatchDone) -> None:
        # a writer the store's flock does not reach (another host): it publishes a new manifest
        manifest = segments.read_manifest(seg.data_dir)
        manifest.version += 1
        segments.publish(seg.data_dir, manifest)

    with pytest.raises(StoreError, match="moved while it was copied .* run 'dimple migrate' again"):
        migrated(on_lake(seg), batch_size=3, on_batch=writer_without_the_lock)
    assert not (seg.data_dir / MARKER).exists()


def test_an_empty_segment_store_is_migrated_to_an_empty_lake(tmp_path):
    seg = _settings(tmp_path, "data")
    write(seg, parse_records([{"id": "a", "namespace": "n", "content": "to be forgotten"}], seg))
    write(seg, forget=["a"])
    report = migrated(on_lake(seg))
    assert report.memories == 0 and report.base is None and (seg.data_dir / MARKER).exists()
    reader = reader_for(on_lake(seg))
    try:
        assert reader.snapshot() is None  # nothing written yet, as a new lake reads
    finally:
        reader.close()
    assert files_holding(b"to be forgotten", on_lake(seg).lake_data_path, seg.data_dir / "lake.sqlite") == []


def test_a_store_from_before_segments_is_refused_and_migrated(tmp_path):
    seg = _settings(tmp_path, "data")
    write(seg, parse_records([{"id": f"o{i}", "namespace": "n", "content": f"old note {i} about redis"}
                              for i in range(12)], seg))
    # the layout before segments: one store.duckdb, no MANIFEST
    segments.base_path(seg.data_dir).rename(seg.data_dir / "store.duckdb")
    (seg.data_dir / "MANIFEST").unlink()
    shutil.rmtree(seg.data_dir / "segments")
    before = get(seg, [f"o{i}" for i in range(12)])
    assert len(before) == 12
    with pytest.raises(StoreError, match=r"holds a segment store from before segments \(store.duckdb\) that is not"):
        reader_for(on_lake(seg))
    report = migrated(on_lake(seg))
    assert (report.memories, report.segment_version) == (12, 0)
    assert get(on_lake(seg), [f"o{i}" for i in range(12)]) == before
    assert (seg.data_dir / "store.duckdb").exists()
