"""BM25, the one formula of the full-text leg: the numpy scorer (``bm25``),
the SQL path's expression (``bm25_sql``, generated from the same two parts)
and the IDF alone (``idf``, what fusion's lexical match sums) all come from here.

Scores are the DuckDB FTS extension's, formula for formula (``match_bm25`` in
DuckDB 1.5.5); a memory scores the sum over matched terms of

    log10((N - df + 0.5) / (df + 0.5) + 1) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl))

with ``log`` being DuckDB's base-10 logarithm, ``len`` the memory's token
count after stopword removal, ``avgdl`` its mean, ``N`` the number of indexed
memories; the extension's defaults are k1 = 1.2, b = 0.75 and
``conjunctive := 0`` (any term matches), ours come from settings (k1 = 0.6, b = 0.5).
``tests/unit/test_fulltext.py`` checks rankings and scores against
``match_bm25`` itself over hundreds of random queries, on both paths.
"""

from __future__ import annotations

import math

import numpy as np

# The two factors, written once with named slots; ``bm25_sql`` fills them
# with SQL, and the Python below computes them in the same order.
_IDF = "log(((({n} - {df}) + 0.5) / ({df} + 0.5)) + 1)"
_TF = "(({tf} * ({k1} + 1)) / ({tf} + ({k1} * ((1 - {b}) + ({b} * ({len} / {avgdl}))))))"


def idf(df: int, n: int) -> float:
    """BM25's IDF of a term held by ``df`` of ``n`` memories (base-10 log, as the extension)."""
    return math.log10(((n - df) + 0.5) / (df + 0.5) + 1)


def bm25(tf: np.ndarray, lens: np.ndarray, df: int, n: int, avgdl: float, k1: float, b: float) -> np.ndarray:
    """One term's BM25 weight for documents with term frequencies ``tf`` and
    lengths ``lens``: the extension's ``match_bm25`` formula (base-10 log)."""
    return idf(df, n) * ((tf * (k1 + 1)) / (tf + (k1 * ((1 - b) + (b * (lens / avgdl))))))


def bm25_sql(*, tf: str, length: str, df: str, n: str, avgdl: str, k1: str = "$k1", b: str = "$b") -> str:
    """The same weight as a SQL expression over the given columns or fixed
    fragments (never user text: callers pass column names and placeholders)."""
    return (_IDF.format(n=n, df=df) + " * "
            + _TF.format(tf=tf, k1=k1, b=b, len=length, avgdl=avgdl))
