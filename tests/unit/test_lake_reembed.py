"""``dimple reembed`` (the lake): every live memory embedded again by the
configured model, committed in batches, put in place in one commit that
records the model, and a base built there; resumable, writes go on
meanwhile, a write prepared with the old model is refused."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta

import numpy as np
import pytest

from pipeline.embedders import HashEmbedder
from pipeline.errors import ModelMismatchError, StoreError
from pipeline.settings import LimitSettings, Settings
from pipeline.store.ingest import parse_lines
from pipeline.store.lake import Lake
from pipeline.store.lake.follow import Follower, listed, reader_for
from pipeline.store.lake.records import vectors_of
from pipeline.store.reembed import reembed
from pipeline.store.writes import get, write
from tests.conftest import store_settings
from tests.lakes import age_forgets, files_holding


def _parsed(*texts: str, start: int = 0, **fields):
    lines = [json.dumps({"id": f"m{start + i}", "namespace": "ns", "content": t, **fields}) for i, t in enumerate(texts)]
    return parse_lines(lines, LimitSettings())


def _write(settings: Settings, parsed=None, forget=None, **kw):
    reader = reader_for(settings)
    try:
        return write(settings, parsed, forget, reader=reader, **kw)
    finally:
        reader.close()


def _get(settings: Settings, ids: list[str]) -> list[dict]:
    reader = reader_for(settings)
    try:
        return get(settings, ids, reader)
    finally:
        reader.close()


def _held(settings: Settings) -> tuple[tuple[str, int], dict[str, tuple[str, np.ndarray]]]:
    """The lake's recorded (model, dim), and each memory's (content, embedding)."""
    with Lake.open(settings) as lake:
        rows = lake.con.execute("SELECT id, content, embedding FROM memories ORDER BY id").fetchall()
        staged = lake.con.execute("SELECT count(*) FROM reembedded").fetchone()
        assert staged == (0,)
        dim = lake.info.embedding_dim
        return (lake.info.embedding_model, dim), {r[0]: (r[1], vectors_of([r[2]], dim)[0]) for r in rows}


def _embedded_by(held: dict[str, tuple[str, np.ndarray]], embedder: HashEmbedder) -> bool:
    ids = sorted(held)
    return np.allclose(np.stack([held[i][1] for i in ids]), embedder.embed([held[i][0] for i in ids]), atol=1e-6)


@pytest.fixture
def lake(tmp_path) -> Settings:
    return store_settings(tmp_path)


def test_reembed_moves_the_lake_to_another_model_keeping_every_memory_as_written(lake):
    _write(lake, _parsed("deploy window on fridays", "redis host db-3", "the user prefers dark mode"))
    linked = json.dumps({"id": "m3", "namespace": "ns", "content": "no deploys on fridays any more",
                         "context": "ops channel", "metadata": {"by": "ana"}, "topics": ["deploys"],
                         "supersedes": ["m0"]})
    _write(lake, parse_lines([linked], LimitSettings()), forget=["m1"])  # a snapshot over the base
    ids = ["m0", "m1", "m2", "m3"]
    before = _get(lake, ids)
    assert [r["id"] for r in before] == ["m0", "m2", "m3"]

    other = lake.replace(embedding_model="hash-32")
    report = reembed(other)
    assert (report.memories, report.model, report.dim, report.previous) == (3, "hash-32", 32, ("hash-64", 64))
    recorded, held = _held(lake)
    assert recorded == ("hash-32", 32) and sorted(held) == ["m0", "m2", "m3"]
    assert _embedded_by(held, HashEmbedder(32))
    assert _get(other, ids) == before  # content, context, metadata, topics and links as written
    reader = reader_for(other)
    try:  # a process started now reads the base the re-embedding built, of the new model
        snap = reader.snapshot()
        assert snap is not None and snap.store is not None and snap.version == report.version
        assert (snap.store.info.embedding_model, snap.store.info.embedding_dim) == ("hash-32", 32)
    finally:
        reader.close()
    follower = Follower(other)
    try:
        lake_of = follower.lake()
        assert lake_of is not None and max(listed(lake_of)) < report.version  # listed at the re-embedding's snapshot
    finally:
        follower.close()

    assert _write(other, _parsed("coffee at the release", start=9)).embedded == 1  # the new model writes
    with pytest.raises(ModelMismatchError):
        _write(lake, _parsed("tea at the standup", start=10))  # the old one no longer does


def test_a_reembed_stopped_midway_leaves_the_old_model_in_use_and_resumes(lake):
    _write(lake, _parsed(*[f"memory number {i} about topic {i % 3}" for i in range(10)]))
    other = lake.replace(embedding_model="hash-64-b")  # the same dimension: only the model tells them apart

    def stop_after_two(batch: int, memories: int) -> None:
        if batch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        reembed(other, batch_size=4, on_batch=stop_after_two)
    with Lake.open(lake) as opened:  # nothing in place yet: the old model serves, reads and writes
        assert (opened.info.embedding_model, opened.count()) == ("hash-64", 10)
        assert opened.con.execute("SELECT count(*) FROM reembedded").fetchone() == (8,)
    assert _write(lake, _parsed("written while stopped", start=20)).inserted == 1

    report = reembed(other, batch_size=4)
    assert (report.resumed, report.batches, report.memories) == (8, 1, 11)  # m2..m9 left, and m20
    recorded, held = _held(lake)
    assert recorded == ("hash-64-b", 64) and len(held) == 11 and _embedded_by(held, HashEmbedder(64, "b"))


def test_writes_during_a_reembed_are_embedded_by_the_new_model_before_it_is_put_in_place(lake):
    _write(lake, _parsed(*[f"memory number {i}" for i in range(6)]))
    other = lake.replace(embedding_model="hash-32")

    def meanwhile(batch: int, memories: int) -> None:
        if batch == 1:  # a process still on the old model writes: a new memory, a replacement, a forget
            _write(lake, _parsed("memory number 0, edited", start=0))
            _write(lake, _parsed("a memory written during the reembed", start=7))
            _write(lake, forget=["m5"])

    report = reembed(other, batch_size=2, on_batch=meanwhile)
    assert report.memories == 6
    recorded, held = _held(lake)
    assert recorded == ("hash-32", 32) and sorted(held) == ["m0", "m1", "m2", "m3", "m4", "m7"]
    assert held["m0"][0] == "memory number 0, edited" and _embedded_by(held, HashEmbedder(32))


class Meanwhile(HashEmbedder):
    """The old model's embedder that runs a re-embedding while a write is between its validation and its commit."""

    def __init__(self, settings: Settings):
        super().__init__(64)
        self.settings: Settings | None = settings

    def embed(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        if self.settings is not None:
            settings, self.settings = self.settings, None
            reembed(settings)
        return super().embed(texts, progress)


def test_a_write_embedded_by_the_old_model_and_committed_after_the_reembed_is_refused(lake):
    _write(lake, _parsed("deploy window on fridays", "redis host db-3"))
    other = lake.replace(embedding_model="hash-64-b")  # same dimension: only the commit's model check can tell
    with pytest.raises(ModelMismatchError) as info:
        _write(lake, _parsed("tea at the standup", start=5), embedder=Meanwhile(other))
    assert info.value.field == "setting embedding_model" and "'hash-64-b'" in info.value.reason
    recorded, held = _held(lake)
    assert recorded == ("hash-64-b", 64) and sorted(held) == ["m0", "m1"]  # nothing of the write committed
    assert _embedded_by(held, HashEmbedder(64, "b"))


@pytest.mark.parametrize("read_first", [False, True])
def test_a_process_reading_across_a_reembed_loads_the_new_base(lake, read_first):
    """A running process's next read after the re-embedding (of another
    dimension) takes up its base: the view then names the new model, so a
    process configured with the old one is refused by the model check. Also
    when its open lake read a whole snapshot since (``read_first``: as a base
    build does), which brings its recorded model up to date first."""
    _write(lake, _parsed("deploy window on fridays", "redis host db-3"))
    reader = reader_for(lake)
    try:
        assert reader.snapshot() is not None
        report = reembed(lake.replace(embedding_model="hash-32"))
        if read_first:
            follower = reader.lake
            assert isinstance(follower, Follower)
            opened = follower.lake()
            assert opened is not None and len(opened.read()) == 2 and opened.info.embedding_dim == 32
        snap = reader.snapshot(fresh=True)
        assert snap is not None and snap.store is not None and snap.version == report.version
        assert (snap.store.info.embedding_model, snap.store.info.embedding_dim) == ("hash-32", 32)
        assert snap.index().emb.shape == (2, 32)
    finally:
        reader.close()


def test_reembed_of_an_empty_lake_is_refused(lake):
    with pytest.raises(StoreError, match="no store in the lake"):
        reembed(lake.replace(embedding_model="hash-32"))


def test_a_vector_staged_by_a_stopped_reembed_goes_with_its_memory_when_the_forget_is_erased(lake):
    """A forgotten memory's bytes are gone within ``store.erase_within`` from
    every data file: the new-model vector a stopped reembed staged for it
    too, not only its row in ``memories``."""
    from pipeline.store.maintenance import compact

    _write(lake, _parsed(*[f"memory number {i} about topic {i % 3}" for i in range(10)]))
    other = lake.replace(embedding_model="hash-64-b")

    def stop_after_one(batch: int, memories: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        reembed(other, batch_size=4, on_batch=stop_after_one)
    with Lake.open(lake) as opened:
        staged = dict(opened.con.execute("SELECT id, content_hash FROM reembedded").fetchall())
    assert len(staged) == 4
    gone = sorted(staged)[0]
    _write(lake, forget=[gone])
    age_forgets(lake, timedelta(hours=2))
    assert compact(lake, wait=True).ran
    with Lake.open(lake) as opened:
        assert sorted(r[0] for r in opened.con.execute("SELECT id FROM reembedded").fetchall()) == sorted(staged)[1:]
        data_path = opened.data_path
    assert data_path.is_relative_to(lake.data_dir)  # the catalog, the data files, the bases: one folder to scan
    # the staged row's own bytes (its content hash: the vector compresses past a scan) in no file
    assert not files_holding(staged[gone].encode(), lake.data_dir)
    assert files_holding(staged[sorted(staged)[1]].encode(), lake.data_dir), \
        "the scan must find a content hash that stays"


def test_a_batch_size_below_one_is_refused_naming_it(lake):
    from pipeline.errors import InputError

    with pytest.raises(InputError, match="batch_size"):
        reembed(lake.replace(embedding_model="hash-64-b"), batch_size=0)


def test_vectors_of_another_size_than_the_process_opened_the_lake_with_name_the_setting():
    with pytest.raises(ModelMismatchError) as caught:
        vectors_of([bytes(4 * 32)], 64)  # a 32-d vector where this process reads 64-d ones
    assert caught.value.field == "embedding_model" and "re-embedded since" in str(caught.value)
