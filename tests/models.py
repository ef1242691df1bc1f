"""Small sentence-transformers models that tests build and save themselves (nothing is downloaded).

``tiny_bert`` is a randomly initialised BERT (2 layers, hidden 32 by default)
with its own word-piece vocabulary, saved by sentence-transformers as a model
folder: a second model besides the packaged MiniLM, small enough to build in a
test. Importing this module costs nothing; building a model imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path

WORDS = ("the a an and or of to in on at for with is are was be by it this that we our you deploy window friday "
         "fridays monday redis host db database backup cache user prefers dark mode standup moved meeting notes "
         "server api gateway error retry budget team release tuesday morning evening coffee tea").split()
LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"


def tiny_bert(folder: Path, *, pooling: str = "mean", dense: bool = False, seed: int = 0, hidden: int = 32,
              layers: int = 2, heads: int = 4, max_positions: int = 64, init: float = 0.2) -> Path:
    """A random BERT saved by sentence-transformers at ``folder`` (returned):
    Transformer -> Pooling(``pooling``) [-> Dense(hidden, 16) when ``dense``]."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling, Transformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    hf = folder.with_name(folder.name + "-hf")
    hf.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *LETTERS, *(f"##{c}" for c in LETTERS), *WORDS]
    tokenizer = BertTokenizerFast(tokenizer_object=_word_pieces(list(dict.fromkeys(vocab))), do_lower_case=True)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=2 * hidden, max_position_embeddings=max_positions,
                        initializer_range=init)  # BERT's 0.02 leaves a random [CLS] alike for every text
    BertModel(config).save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    transformer = Transformer(str(hf))
    modules = [transformer, Pooling(hidden, pooling_mode=pooling)]
    if dense:
        modules.append(Dense(hidden, 16))
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def _word_pieces(vocab: list[str]):
    """BERT's uncased word-piece tokenizer over ``vocab`` (built with ``tokenizers`` itself)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    ids = {token: i for i, token in enumerate(vocab)}
    tok = Tokenizer(WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    tok.decoder = decoders.WordPiece()
    return tok
