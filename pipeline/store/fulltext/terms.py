"""Terms: how text becomes the full-text index's terms, for a memory and for a query.

The DuckDB FTS extension indexes a memory's text with its tokenizer, stopwords
and stemmer; ``create_index_sql`` is that PRAGMA, written once for the store's
index (``pipeline.store.fulltext.index``) and for a delta's memories
(``Tokenizer``), so a delta's terms are what a compacted index would hold.
A query's terms (``QueryTerms``) follow the same rule. The tokenizer keeps
letters and digits of every script and ``_`` (``ignore`` in settings), so
identifiers such as ``ERR_CONN_RESET``, ``db-17`` or ``JIRA-4412`` become terms
a query can hit, and so do ``Москве``, ``κόσμε`` or ``بالعالم``.

Before the extension sees a text, ``analyze`` does what its PRAGMA cannot
express, the same for a memory (``pipeline.store.ingest.fts_text``) and a
query: it writes what Unicode writes two ways in one (NFKC: full-width Latin
and digits ``ＺＯＯＭ３``, half-width kana ``ｶﾞｽ``, ligatures) and Greek final
sigma as sigma (``ΟΔΟΣ`` lowered is ``οδοσ``, not ``οδος``); it folds
accents where they are accents (Latin, Greek, Arabic, Hebrew
marks, Cyrillic ё and stress marks), not where a mark makes another letter
(``й``, kana voicing ``ガ``, Indic and Thai vowel signs), which the extension's
``strip_accents`` would fold too; and it splits runs of Han, kana and Hangul,
written without spaces, into overlapping character bigrams (a lone character
stays a unigram). A memory's runs give each of their characters too
(``unigrams``), so a one-character word (猫, 书, 車) finds the memories whose
runs hold it, while a query's run stays its bigrams (the index's bigrams rank
a longer query as before). ASCII text passes unchanged.
"""

from __future__ import annotations

import os
import re
import threading
import unicodedata
from collections import Counter
from functools import lru_cache

import duckdb
import regex

from pipeline.settings import FulltextSettings
from pipeline.store.database import fts_extension_path
from pipeline.store.fulltext import porter

# runs of the scripts written without spaces between words: Han, kana, Hangul,
# and the kana length and (half-width) voicing marks, which are script Common
_CJK_RUN = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\u30fc\uff70\uff9e\uff9f]+")
# a letter (or other base character) and the combining marks that follow it, decomposed
_MARKED = regex.compile(r"(\P{M})(\p{M}+)")
_ACCENT_SCRIPTS = ("LATIN", "GREEK", "ARABIC", "HEBREW")
_CYRILLIC_ACCENTS = frozenset("\u0300\u0301")  # grave and acute: stress marks, not letters


def analyze(text: str, *, unigrams: bool = False) -> str:
    """``text`` as the index reads it (the module doc): accents folded where
    they are accents, Han/kana/Hangul runs as character bigrams, and with
    ``unigrams`` (a memory's text: ``ingest.fts_text_of``) as their
    characters too; ASCII text unchanged."""
    if text.isascii():
        return text
    # ＺＯＯＭ is ZOOM, ｶﾞ is ガ; Greek final sigma is sigma (lower() makes Σ σ, never ς)
    text = unicodedata.normalize("NFKC", text).replace("ς", "σ")
    folded = unicodedata.normalize("NFC", _MARKED.sub(_fold, unicodedata.normalize("NFD", text)))
    return _CJK_RUN.sub(_grams if unigrams else _bigrams, folded)


def _fold(match: regex.Match) -> str:
    base, marks = match.group(1), match.group(2)
    return base + "".join(m for m in marks if not _is_accent(base, m))


@lru_cache(maxsize=4096)
def _is_accent(base: str, mark: str) -> bool:
    """Whether ``mark`` on ``base`` is an accent to fold (as the extension's
    ``strip_accents`` folds every mark) rather than part of a letter."""
    if not unicodedata.category(base).startswith("L"):
        return True  # a mark on a digit, a space or a symbol, folded as before
    script = unicodedata.name(base, "").split(" ", 1)[0]
    if script == "CYRILLIC":  # ё -> е and stress marks; й, ў, ї stay letters
        return mark in _CYRILLIC_ACCENTS or (mark == "\u0308" and base in "еЕ")
    return script in _ACCENT_SCRIPTS


def _bigrams(match: regex.Match) -> str:
    run = match.group(0)
    if len(run) < 3:
        return f" {run} "
    return " " + " ".join(run[i:i + 2] for i in range(len(run) - 1)) + " "


def _grams(match: regex.Match) -> str:
    """A run's characters and its bigrams (a lone character: itself, once)."""
    run = match.group(0)
    return f" {run} " if len(run) == 1 else " " + " ".join(run) + _bigrams(match)


def create_index_sql(table: str, key: str, settings: FulltextSettings) -> str:
    """The extension's ``create_fts_index`` PRAGMA over ``table.fts_text`` with
    the store's settings. PRAGMA arguments cannot be bound: ``table`` and
    ``key`` are the callers' fixed names, every value comes from validated settings."""
    ignore = settings.ignore.replace("'", "''")
    # accents are folded by ``analyze``, before the text is stored (strip_accents=1 would fold й to и)
    return (f"PRAGMA create_fts_index('{table}', '{key}', 'fts_text', "
            f"stemmer='{settings.stemmer}', stopwords='{settings.stopwords}', "
            f"ignore='{ignore}', strip_accents=0, lower=1, overwrite=1)")


class QueryTerms:
    """A query's distinct stemmed terms, as the index makes a memory's: the
    text ``analyze``d, then the ``tokenize`` macro (``lower(text)``, the
    ``ignore`` pattern replaced by spaces, split on whitespace), the index's ``stopwords``
    dropped, then each token stemmed. Stopwords go before stemming, as at
    indexing: a stopword's stem can be a word's ("at" is the stem of "ate"),
    and the extension's ``match_bm25``, which stems a query's stopwords too,
    lets "meet at noon" find "we ate pizza".

    ASCII text is split here (``analyze`` leaves it alone, ``lower`` is an
    ASCII operation, and the ``regex`` module reads the pattern as DuckDB's
    RE2 does on ASCII, ``\\p{L}`` included); other text goes to DuckDB's own macro.
    The default stemmer, ``porter``, runs here (``porter.stem``: DuckDB's
    answer for every word, tested), so a query of new words runs no SQL
    either (one statement a query was ~0.9 ms at 100,000 memories, where
    most queries hold a word no earlier one did). Another stemmer's stems
    come from DuckDB's ``stem`` once per distinct token and are cached
    (bounded), so the steady state runs no SQL.
    """

    _CACHE = 200_000

    def __init__(self, ignore: str, stemmer: str, stopwords: frozenset[str] = frozenset()):
        self.ignore = regex.compile(ignore)
        self.stemmer = stemmer
        self.stopwords = stopwords
        self._stems: dict[str, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, con, settings: FulltextSettings) -> QueryTerms | None:
        """The rule of the index read through ``con`` (its stopwords), None when
        Python's ``regex`` cannot read the ``ignore`` pattern (then ``terms_sql``,
        the macro itself, answers)."""
        try:
            return cls(settings.ignore, settings.stemmer, stopwords(con) or frozenset())
        except regex.error:
            return None

    def __call__(self, con, text: str) -> list[str]:
        if not text.strip():
            return []
        if not text.isascii():
            return terms_sql(con, text, self.stemmer, self.stopwords)
        return [t for t in dict.fromkeys(self._stemmed(con, text)) if t]

    def counts(self, con, text: str) -> tuple[int, dict[str, int]]:
        """(token count, {term: frequency}) of an ASCII ``text`` as the index
        holds a memory's (``Tokenizer``): its tokens but the stopwords, stemmed,
        an empty stem counted as the extension counts it (``s`` stems to
        nothing, and is no stopword with ``stopwords='none'``)."""
        stems = self._stemmed(con, text)
        return len(stems), dict(Counter(stems))

    def _stemmed(self, con, text: str) -> list[str]:
        """Each token of an ASCII ``text`` but the stopwords, stemmed, in order."""
        tokens = [t for t in re.split(r"\s+", self.ignore.sub(" ", text.lower())) if t and t not in self.stopwords]
        stems = self._stems
        missing = [t for t in dict.fromkeys(tokens) if t not in stems]
        if missing:
            got = self._stem(con, missing)
            with self._lock:
                if len(stems) > self._CACHE:
                    stems.clear()
                stems.update(zip(missing, got, strict=True))
        return [stems[t] if t in stems else self._stem(con, [t])[0] for t in tokens]  # cleared meanwhile

    def _stem(self, con, tokens: list[str]) -> list[str]:
        if self.stemmer == "porter":  # the default: here, as DuckDB's Snowball Porter stems
            return [porter.stem(t) for t in tokens]
        return con.execute("SELECT list_transform($w, x -> stem(x, $stemmer))",
                           {"w": tokens, "stemmer": self.stemmer}).fetchone()[0]


def stopwords(con) -> frozenset[str] | None:
    """The index's stopwords (an empty table with ``stopwords='none'``); None
    when ``con`` has no index to read them from. Any other failure is raised:
    a read the query's deadline interrupted is no empty list (a base keeps
    the rule it reads first, ``Postings.query_terms``)."""
    try:
        return frozenset(r[0] for r in con.execute("SELECT sw FROM fts_main_memories.stopwords").fetchall())
    except duckdb.InterruptException:
        raise
    except duckdb.Error:
        return None


def query_terms(con, text: str, settings: FulltextSettings, rule: QueryTerms | None = None) -> list[str]:
    """The distinct stemmed terms of ``text``, by the index's own tokenizer,
    stopwords and stemmer: with ``rule`` (a base's cached ``QueryTerms``) when
    given, else read from the index through ``con`` for this call."""
    rule = rule if rule is not None else QueryTerms.of(con, settings)
    if rule is None:
        return terms_sql(con, text, settings.stemmer, stopwords(con) or frozenset())
    return rule(con, text)


# the index's ``tokenize`` macro, stopwords dropped, then ``stem``: a query's terms in SQL
TERMS_SQL = ("SELECT DISTINCT stem(w, $stemmer) AS t FROM (SELECT unnest(fts_main_memories.tokenize($q)) AS w) "
             "WHERE w <> '' AND NOT list_contains($stop, w)")


def terms_sql(con, text: str, stemmer: str, stopwords: frozenset[str]) -> list[str]:
    """``QueryTerms`` by the index's own macro (after ``analyze``), for text the Python rule does not cover."""
    if not text.strip():
        return []
    params = {"q": analyze(text), "stemmer": stemmer, "stop": sorted(stopwords)}
    return [r[0] for r in con.execute(TERMS_SQL, params).fetchall() if r[0]]


class Tokenizer:
    """A delta's memories as the FTS extension tokenizes them. An ASCII text
    is split and stemmed here by the rule a query's terms follow
    (``QueryTerms.counts``, with the extension's own stopword list), the same
    counts as the extension's index gives (``tests/unit/test_porter.py``):
    building an index for it cost ~24 ms a write, paid again by every
    process following the lake. Other text, and an ``ignore`` pattern Python
    cannot read, goes to the extension: an index of the delta's texts in an
    in-memory DuckDB of its own, opened on first use and kept; a forked child
    opens its own. One call at a time (its lock): on the lake a process's
    writes and its follower's threads (a search, the audit drain's settings
    poll) build deltas at once, and their statements on the one connection
    would interleave (a ``SELECT`` reading another call's result)."""

    def __init__(self) -> None:
        self._con: duckdb.DuckDBPyConnection | None = None
        self._pid = 0
        self._lock = threading.Lock()
        self._rules: dict[tuple[str, str, str], QueryTerms | None] = {}

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None or self._pid != os.getpid():
            con = duckdb.connect()
            con.execute(f"LOAD '{str(fts_extension_path()).replace(chr(39), chr(39) * 2)}'")
            self._con, self._pid = con, os.getpid()
        return self._con

    def __call__(self, texts: list[str], settings: FulltextSettings) -> list[tuple[int, dict[str, int]]]:
        """(token count, {term: frequency}) of each text as the FTS extension counts
        it with the store's settings: the same tokenizer, stemmer and stopwords that
        index the base, so a delta's memories score as a compacted index would score them."""
        if not texts:
            return []
        with self._lock:
            return self._tokenize(texts, settings)

    def _tokenize(self, texts: list[str], settings: FulltextSettings) -> list[tuple[int, dict[str, int]]]:
        con = self._connection()
        rule = self._rule(con, settings)
        if rule is None:
            return self._indexed(con, texts, settings)
        out = [rule.counts(con, t) if t.isascii() else (0, {}) for t in texts]
        rest = [i for i, t in enumerate(texts) if not t.isascii()]
        for i, counted in zip(rest, self._indexed(con, [texts[i] for i in rest], settings) if rest else [], strict=True):
            out[i] = counted
        return out

    def _rule(self, con: duckdb.DuckDBPyConnection, settings: FulltextSettings) -> QueryTerms | None:
        """The Python rule for these settings, the extension's stopwords read
        once from an index of no text (None: ``regex`` cannot read ``ignore``)."""
        key = (settings.ignore, settings.stemmer, settings.stopwords)
        if key not in self._rules:
            self._indexed(con, [], settings)
            words = frozenset(r[0] for r in con.execute("SELECT sw FROM fts_main_delta_docs.stopwords").fetchall())
            try:
                self._rules[key] = QueryTerms(settings.ignore, settings.stemmer, words)
            except regex.error:
                self._rules[key] = None
        return self._rules[key]

    def _indexed(self, con: duckdb.DuckDBPyConnection, texts: list[str],
                 settings: FulltextSettings) -> list[tuple[int, dict[str, int]]]:
        """``texts`` counted by the extension's own index of them."""
        con.execute("CREATE OR REPLACE TABLE delta_docs (pos INTEGER, fts_text VARCHAR)")
        con.execute("INSERT INTO delta_docs SELECT unnest(?), unnest(?)", [list(range(len(texts))), texts])
        con.execute(create_index_sql("delta_docs", "pos", settings))
        out: list[tuple[int, dict[str, int]]] = [(0, {}) for _ in texts]
        for pos, length in con.execute("SELECT name, len FROM fts_main_delta_docs.docs").fetchall():
            out[int(pos)] = (int(length), {})
        for pos, term, tf in con.execute(
            "SELECT d.name, t2.term, count(*) FROM fts_main_delta_docs.terms t "
            "JOIN fts_main_delta_docs.docs d ON d.docid = t.docid "
            "JOIN fts_main_delta_docs.dict t2 ON t2.termid = t.termid GROUP BY 1, 2"
        ).fetchall():
            out[int(pos)][1][term] = int(tf)
        return out


# the writer's tokenizer: one per process (a connection of its own, reopened after a fork)
tokenize = Tokenizer()
