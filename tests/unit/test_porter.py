"""The query's Porter stemmer (``pipeline.store.fulltext.porter``) against
DuckDB's own ``stem(word, 'porter')``, which built the index: a word they
stemmed differently would give a query other terms than the index holds."""

from __future__ import annotations

import json
import os
import random
import re
from importlib import resources

import duckdb
import pytest

from pipeline.settings import FulltextSettings
from pipeline.store.database import fts_extension_path
from pipeline.store.fulltext import QueryTerms, porter
from pipeline.store.fulltext.terms import Tokenizer
from tests.unit.test_base_graph import _Counting


@pytest.fixture(scope="module")
def duck():
    con = duckdb.connect()
    con.execute(f"LOAD '{str(fts_extension_path()).replace(chr(39), chr(39) * 2)}'")
    yield con
    con.close()


def _duckdb_stems(con, words: list[str]) -> list[str]:
    return con.execute("SELECT list_transform($w, x -> stem(x, 'porter'))", {"w": words}).fetchone()[0]


def _demo_words() -> set[str]:
    words: set[str] = set()
    for entry in resources.files("pipeline.datasets.demo_data").iterdir():
        if entry.name.endswith(".json"):
            words.update(re.findall(r"[a-z0-9]+", entry.read_text(encoding="utf-8").lower()))
    return words


def _generated_words(n: int, seed: int) -> set[str]:
    """Short stems of every kind of letter (y and w, x among them) and digits,
    followed by up to three of the suffixes each step removes."""
    suffixes = sorted({*porter._STEP1A, *porter._STEP1B_KEYS, *porter._STEP2, *porter._STEP3, *porter._STEP4_KEYS,
                       "e", "l", "ll", "y", "ly", "ied", "ying", "bled", "izing", "hopping", "sion", "tion"})
    rnd = random.Random(seed)
    words = set()
    for _ in range(n):
        word = "".join(rnd.choice("aeiouybcdfghlmnprstvwxz0123") for _ in range(rnd.randint(0, 7)))
        word += "".join(rnd.choice(suffixes) for _ in range(rnd.randint(0, 3)))
        if word:
            words.add(word)
    return words


def test_every_word_of_the_demo_corpus_stems_as_duckdb_stems_it(duck):
    words = sorted(_demo_words())
    assert len(words) > 500
    assert [porter.stem(w) for w in words] == _duckdb_stems(duck, words)


def test_generated_words_stem_as_duckdb_stems_them(duck):
    words = sorted(_generated_words(60_000, seed=11))
    expected = _duckdb_stems(duck, words)
    differ = [(w, e, porter.stem(w)) for w, e in zip(words, expected, strict=True) if porter.stem(w) != e]
    assert not differ, differ[:10]


@pytest.mark.parametrize(("word", "stemmed"), [
    ("caresses", "caress"), ("ponies", "poni"), ("agreed", "agre"), ("hopping", "hop"), ("hoping", "hope"),
    ("filing", "file"), ("happy", "happi"), ("relational", "relat"), ("generalization", "gener"),
    ("adjustment", "adjust"), ("controlling", "control"), ("sky", "sky"), ("yes", "ye"), ("saying", "sai"),
    ("", ""),
])
def test_the_algorithms_own_examples(duck, word, stemmed):
    assert porter.stem(word) == stemmed == (_duckdb_stems(duck, [word])[0] if word else "")


class _NoSQL:
    def execute(self, *args, **kwargs):
        raise AssertionError("a query's terms ran SQL")


def test_query_terms_with_the_default_stemmer_run_no_sql():
    fts = FulltextSettings()
    assert fts.stemmer == "porter"
    rule = QueryTerms(fts.ignore, fts.stemmer, frozenset({"the"}))
    assert rule(_NoSQL(), "The running connections, CONNECTED again") == ["run", "connect", "again"]


def test_another_stemmer_asks_duckdb_once_per_new_word(duck):
    rule = QueryTerms(FulltextSettings().ignore, "german", frozenset())
    counting = _Counting(duck)
    expected = [duck.execute("SELECT stem(?, 'german')", [w]).fetchone()[0] for w in ("laufen", "hausern")]
    assert rule(counting, "laufen hausern") == expected
    assert rule(counting, "hausern laufen") == expected[::-1]
    assert counting.statements == 1


def _demo_texts() -> list[str]:
    texts: list[str] = []

    def walk(x) -> None:
        if isinstance(x, str):
            texts.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    for entry in resources.files("pipeline.datasets.demo_data").iterdir():
        if entry.name.endswith(".json"):
            walk(json.loads(entry.read_text(encoding="utf-8")))
    return texts


@pytest.mark.parametrize(("stemmer", "stopwords"), [("porter", "english"), ("english", "english"), ("porter", "none")])
def test_a_deltas_memories_count_as_the_extensions_index_counts_them(stemmer, stopwords):
    # the writer's counts of an ASCII text come from Python; the index's, from the extension
    settings = FulltextSettings(stemmer=stemmer, stopwords=stopwords)
    rnd = random.Random(5)
    words = sorted(_generated_words(3_000, seed=3)) + ["the", "at", "ate", "a", "it's", "cat's", "x.y", "3.14"]
    texts = _demo_texts() + ["", "   ", "...", "The THE the", "ERR_CONN_RESET db-17 JIRA-4412 v1.2.3 e.g. i.e."]
    texts += [" ".join(rnd.choice(words) for _ in range(rnd.randint(1, 30))) for _ in range(400)]
    texts += ["Встреча в Москве", "naïve café at the MÜNCHEN office"]  # not ASCII: the extension counts them
    assert len(texts) > 1_000
    tokenizer = Tokenizer()
    ours = tokenizer(texts, settings)
    theirs = tokenizer._indexed(tokenizer._connection(), texts, settings)
    differ = [(t, o, e) for t, o, e in zip(texts, ours, theirs, strict=True) if o != e]
    assert not differ, differ[:5]
    assert sum(n for n, _ in ours) > 10_000


def test_an_ascii_delta_is_counted_without_an_index():
    tokenizer = Tokenizer()
    settings = FulltextSettings()
    assert tokenizer(["warm weather"], settings) == [(2, {"warm": 1, "weather": 1})]  # the rule read once
    con = tokenizer._con = _Counting(tokenizer._connection())
    tokenizer._pid = os.getpid()
    assert tokenizer(["The running connections, CONNECTED again at noon"], settings) == [
        (4, {"run": 1, "connect": 2, "noon": 1})]
    assert con.statements == 0
