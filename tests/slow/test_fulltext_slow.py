"""The full-text leg against the DuckDB FTS extension's own ``match_bm25``: same
scores, same rankings, same scope filtering, over hundreds of random queries
(frequent and rare terms, stopwords, repeats, unknown words, identifiers) on
2,000 synthetic memories (20,000 in the slow tier). That the cost follows the
postings read, not the store size, is a benchmark (``ops/bench/fulltext.py``),
not a timed test.

The tests of this concern for the slow tier (CI runs it; the default tier does not); the unit tests and the
helpers and fixtures shared with them are in ``tests/unit/test_fulltext.py``.
"""

from __future__ import annotations

import pytest

from ops.bench import synth
from ops.bench.bm25_reference import match_bm25, same_ranking
from pipeline.contracts import Scope
from pipeline.stages import fulltext
from pipeline.store.database import Store
from tests.unit.test_fulltext import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    _queries,
    corpus,
)


@pytest.mark.slow
def test_rankings_equal_match_bm25_at_20k(tmp_path):
    from pipeline.settings import Settings

    settings = Settings(data_dir=tmp_path, embedding_model="hash-64", _env_file=None)
    path = tmp_path / "store.duckdb"
    synth.build_store(path, 20_000, settings, namespaces=4, dim=8, seed=9, log=lambda *_: None)
    with Store.open(path, read_only=True) as store:
        for q in _queries(500, seed=9):
            same, why = same_ranking(match_bm25(store.con, q, Scope(), 30, settings.fulltext),
                                     fulltext.search(store.con, q, Scope(), 10, settings.fulltext), 10)
            assert same, (q, why)
