"""``dimple migrate`` as a library (``pipeline.store.lake.migrate``): a segment
store written by the last dimple that wrote one (links of every kind,
replacements, forgets, a compaction part way, writes after it;
``tests/segment_stores.py``) copied into the lake answers every query as the
segment store did, ``get`` returns the same memories, forgotten ones are in no
file of the lake; a migrate stopped after some batches and run again ends where
an uninterrupted one does; what it refuses.

The query comparison is test_lake_derive's."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from pydantic import ValidationError

import pipeline.embedders
from pipeline.embedders import HashEmbedder
from pipeline.errors import InputError, ModelMismatchError, StoreError
from pipeline.settings import StoreSettings
from pipeline.store import segments
from pipeline.store.database import utcnow
from pipeline.store.ingest import MemoryRecord
from pipeline.store.lake import Lake, LakeMemory, LakeWrite
from pipeline.store.lake.follow import bases, reader_for
from pipeline.store.lake.migrate import BatchDone, migrate
from pipeline.store.reader import read_segments
from pipeline.store.segments import MIGRATED as MARKER
from pipeline.store.writes import get, live_view, parse_records, records_of, write
from tests.lakes import files_holding
from tests.segment_stores import unpack
from tests.unit.test_lake_derive import DIM, Pinned, _settings, answers, assert_same_answers


def segment_records(settings, ids: list[str]) -> list[dict]:
    """The segment store's live memories among ``ids``, as its readers returned them."""
    read = read_segments(settings.data_dir)
    assert read is not None
    try:
        return records_of(read[1], ids)
    finally:
        read[1].close()


def segment_vectors(settings, ids: list[str]) -> np.ndarray:
    read = read_segments(settings.data_dir)
    assert read is not None
    try:
        with live_view(read[1]) as live:
            base = live.in_base(ids)
            return np.stack([live.overlay.emb[live.overlay.row_of[m]] if m in live.overlay.members else base[m][3]
                             for m in ids])
    finally:
        read[1].close()


def migrated(settings, **kwargs):
    """``migrate``, which must embed nothing: the segment store's vectors are kept."""
    def refuse(*args, **kw):
        raise AssertionError("migrate embedded something")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline.embedders, "make_embedder", refuse)
        return migrate(settings, **kwargs)


def test_a_migrated_store_answers_every_query_as_the_segment_store_did(tmp_path):
    seg = _settings(tmp_path, "data")
    facts = unpack("history-29", seg.data_dir)
    texts, live, forgotten = facts["texts"], facts["live"], facts["forgotten"]
    read = read_segments(seg.data_dir)
    assert read is not None
    theirs = read[1]
    assert theirs.deltas and theirs.overlay.forgotten and theirs.overlay.dead_ids
    every = sorted(texts)
    before = records_of(theirs, every)
    kinds = {k for r in before for k in ("supersedes", "conflicts", "supported_by") if r[k]}
    assert kinds == {"supersedes", "conflicts", "supported_by"}
    assert any(len(t) > 1 for m, t in texts.items() if m in live), "a replacement"
    with pytest.raises(StoreError, match=r"holds a segment store \(MANIFEST, version \d+\), the store of earlier "
                                         r"versions, that is not in the lake yet: run 'dimple migrate'"):
        segments.refuse_unmigrated(seg.data_dir)

    seen: list[BatchDone] = []
    report = migrated(seg, batch_size=40, on_batch=seen.append)
    assert (report.memories, report.batches, report.resumed) == (len(live), -(-len(live) // 40), 0)
    assert [b.index for b in seen] == list(range(1, report.batches + 1))
    # a base built at the last batch's snapshot, listed by the next one: the migrate's version
    assert (seg.data_dir / MARKER).exists() and list(bases(seg)) == [seen[-1].snapshot]
    assert report.snapshot == seen[-1].snapshot + 1
    segments.refuse_unmigrated(seg.data_dir)  # the lake opens now

    ours_reader = reader_for(seg)
    try:
        ours = ours_reader.snapshot()
        assert ours is not None and ours.version == report.snapshot
        # ids, order, ranks, links; scores within 1e-12 (the lake's tree and full-text
        # numbering are built whole, the segment store's were updated in place)
        assert_same_answers(answers(Pinned(seg, theirs), seg), answers(Pinned(seg, ours), seg))
        assert get(seg, every, ours_reader) == before  # forgotten ids left out on both
    finally:
        ours_reader.close()
        theirs.close()

    with Lake.open(seg) as lake:
        assert (lake.info.embedding_model, lake.info.embedding_dim) == (f"hash-{DIM}", DIM)
        held = lake.read()
        assert [m.id for m in held] == live
        assert np.array_equal(np.stack([m.embedding for m in held]), segment_vectors(seg, live))
        ends = lake.con.execute("SELECT list(src) || list(dst) || list(origin) FROM edges").fetchone()[0]
        assert ends and set(ends) <= set(live), "a link to a forgotten memory was carried over"
    # not one byte of a forgotten memory, nor of a replaced memory's old text, in the lake's files
    folders = (seg.lake_data_path, seg.data_dir / "indexes", seg.data_dir / "lake.sqlite")
    gone = [t for m, ts in texts.items() for t in (ts if m not in live else ts[:-1])]
    assert len(gone) > 10 and forgotten
    assert files_holding(texts[live[0]][-1].encode(), *folders), "the scan finds a live memory's text"
    assert [t for t in gone if files_holding(t.encode(), *folders)] == []
    # nothing of the segment store was deleted
    manifest = segments.read_manifest(seg.data_dir)
    assert manifest is not None and all((seg.data_dir / f).exists() for f in manifest.files())


def test_a_migrate_stopped_after_some_batches_resumes_to_the_same_lake(tmp_path):
    seg = _settings(tmp_path, "data")
    live = unpack("history-7", seg.data_dir)["live"]

    class Stop(Exception):
        pass

    def stop_after_two(done: BatchDone) -> None:
        if done.index == 2:
            raise Stop

    lake_settings = seg
    with pytest.raises(Stop):
        migrated(lake_settings, batch_size=12, on_batch=stop_after_two)
    assert not (seg.data_dir / MARKER).exists()
    with pytest.raises(StoreError, match="that is not in the lake yet: run 'dimple migrate'"):
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
                                                       for r in segment_records(seg, live)]
    assert np.array_equal(np.stack([m.embedding for m in held]), segment_vectors(seg, live))


def test_what_a_migrate_refuses(tmp_path):
    seg = _settings(tmp_path, "data")
    with pytest.raises(StoreError, match="^nothing to migrate: no segment store in "):
        migrated(seg)
    unpack("six", seg.data_dir)
    # the segment engine is no setting any more: the message says what to do instead
    with pytest.raises(ValidationError, match="engine\n.*the segment store is no longer served: .*'dimple migrate'"):
        StoreSettings(engine="segments")
    with pytest.raises(InputError, match="^batch_size: "):
        migrated(seg, batch_size=0)
    with pytest.raises(ModelMismatchError, match="^setting embedding_model: "):
        migrated(seg.replace(embedding_model="hash-32"))

    # a lake that already holds memories (another store's) is not filled
    crowded = seg.replace(store={"catalog": f"sqlite:{tmp_path / 'other.sqlite'}", "data_path": str(tmp_path / "other")})
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

    done = migrated(seg)
    assert done.memories == 6 and not done.already
    again = migrated(seg)  # a second run: nothing to do
    assert again.already and again.snapshot == done.snapshot and again.memories == 6
    with Lake.open(seg) as lake:
        assert lake.count() == 6 and lake.latest_snapshot() == done.snapshot


def test_a_segment_store_written_after_its_migrate_is_refused_then_caught_up(tmp_path):
    seg = _settings(tmp_path, "data")
    unpack("six", seg.data_dir)
    first = migrated(seg)
    assert first.memories == 6 and not first.caught_up
    write(seg, parse_records({"id": "lk", "namespace": "n", "content": "written on the lake"}, seg))
    # an earlier dimple writes the segment store again: a new memory, a replacement, a forget
    unpack("six-written-again", seg.data_dir)
    with pytest.raises(StoreError, match=r" written after 'dimple migrate' copied version 1 into the lake: run "
                                         r"'dimple migrate' again to copy what changed$"):
        segments.refuse_unmigrated(seg.data_dir)
    with pytest.raises(StoreError, match="written after 'dimple migrate'"):
        reader_for(seg)

    class Stop(Exception):
        pass

    def stop_at_first(done: BatchDone) -> None:
        raise Stop

    with pytest.raises(Stop):  # stopped after its first batch; resumed below
        migrated(seg, batch_size=1, on_batch=stop_at_first)
    with pytest.raises(StoreError, match="written after 'dimple migrate'"):
        segments.refuse_unmigrated(seg.data_dir)
    report = migrated(seg, batch_size=7)
    assert report.caught_up and (report.changed, report.forgotten, report.memories) == (2, 1, 6)
    assert (report.resumed, report.batch_size, report.batches) == (1, 1, 2)
    segments.refuse_unmigrated(seg.data_dir)  # the lake opens again
    live = ["r0", "r2", "r3", "r4", "r5", "r6"]
    with Lake.open(seg) as lake:
        held = {m.id: m for m in lake.read()}
        writes = [r[0] for r in lake.con.execute("SELECT write_id FROM writes").fetchall()]
    assert sorted(held) == sorted([*live, "lk"])  # the lake's own write stays
    assert held["r2"].content == "note 2, replaced"
    assert [held[m].record().model_dump() for m in live] == [MemoryRecord.model_validate(r).model_dump()
                                                             for r in segment_records(seg, live)]
    assert np.array_equal(np.stack([held[m].embedding for m in live]), segment_vectors(seg, live))
    assert len(writes) == len(set(writes))  # each batch committed once
    assert migrated(seg).already
    unpack("six-forgot-again", seg.data_dir)  # a forget alone
    only = migrated(seg)
    assert (only.changed, only.forgotten, only.batches) == (0, 1, 1)
    with Lake.open(seg) as lake:
        assert sorted(m.id for m in lake.read()) == ["lk", "r0", "r2", "r4", "r5", "r6"]


def test_a_segment_store_that_moves_during_the_migrate_is_refused_unmarked(tmp_path):
    seg = _settings(tmp_path, "data")
    unpack("six", seg.data_dir)

    def writer_without_the_lock(done: BatchDone) -> None:
        # a writer the store's flock does not reach (another host): it publishes a new manifest
        path = seg.data_dir / segments.MANIFEST
        manifest = json.loads(path.read_text(encoding="utf-8"))
        manifest["version"] += 1
        path.write_text(json.dumps(manifest), encoding="utf-8")

    with pytest.raises(StoreError, match="moved while it was copied .* run 'dimple migrate' again"):
        migrated(seg, batch_size=3, on_batch=writer_without_the_lock)
    assert not (seg.data_dir / MARKER).exists()


def test_an_empty_segment_store_is_migrated_to_an_empty_lake(tmp_path):
    seg = _settings(tmp_path, "data")
    unpack("all-forgotten", seg.data_dir)  # one memory, then forgotten
    report = migrated(seg)
    assert report.memories == 0 and report.base is None and (seg.data_dir / MARKER).exists()
    reader = reader_for(seg)
    try:
        assert reader.snapshot() is None  # nothing written yet, as a new lake reads
    finally:
        reader.close()
    assert files_holding(b"to be forgotten", seg.lake_data_path, seg.data_dir / "lake.sqlite") == []


def test_a_store_from_before_segments_is_refused_and_migrated(tmp_path):
    seg = _settings(tmp_path, "data")
    unpack("twelve", seg.data_dir)
    ids = [f"o{i}" for i in range(12)]
    before = segment_records(seg, ids)
    assert len(before) == 12
    # the layout before segments: one store.duckdb, no MANIFEST
    base = segments.base_path(seg.data_dir)
    assert base is not None
    base.rename(seg.data_dir / "store.duckdb")
    (seg.data_dir / "MANIFEST").unlink()
    shutil.rmtree(seg.data_dir / "segments")
    assert segment_records(seg, ids) == before
    with pytest.raises(StoreError, match=r"holds a segment store from before segments \(store.duckdb\), the store "
                                         r"of earlier versions, that is not in the lake yet"):
        reader_for(seg)
    report = migrated(seg)
    assert (report.memories, report.segment_version) == (12, 0)
    assert get(seg, ids) == before
    assert (seg.data_dir / "store.duckdb").exists()
