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

import random

import pytest

from ops.bench import synth
from ops.bench.bm25_reference import match_bm25, same_ranking
from pipeline.contracts import Scope
from pipeline.store import fulltext
from pipeline.store.database import Store
from tests.unit.test_fulltext import (  # noqa: F401  (helpers and fixtures shared with the unit tests)
    HANDWRITTEN,
    NAMESPACES,
    SCRIPT_QUERIES,
    SCRIPT_TEXTS,
    TYPES,
    check_scoped,
    in_scope_texts,
    scope_combinations,
)

N = 20_000


@pytest.mark.slow
def test_rankings_equal_match_bm25_at_20k(tmp_path):
    """500+ queries drawn from the store's own texts (so they cannot pass on empty
    answers) and queries in other scripts, 96 scope combinations that each hold memories, top-10 identical to
    ``match_bm25`` on every one."""
    from workers.settings import WorkerSettings

    settings = WorkerSettings(data_dir=tmp_path, embedding_model="hash-64", _env_file=None)
    fts = settings.fulltext
    path = tmp_path / "store.duckdb"
    labels = random.Random(9)
    docs = synth.texts(N - len(SCRIPT_TEXTS), seed=9) + SCRIPT_TEXTS  # and text in other scripts
    synth.build_store(path, N, settings, dim=8, seed=9, docs=docs, log=lambda *_: None,
                      namespace_of=[NAMESPACES[labels.randrange(3)] for _ in range(N)],
                      content_type_of=[TYPES[labels.randrange(3)] for _ in range(N)])
    with Store.open(path, read_only=False) as store:
        store.con.execute("INSERT INTO memory_topics SELECT id, 'deploy', 'user' FROM memories WHERE hash(id) % 5 = 0")
        store.con.execute("INSERT INTO memory_concepts SELECT id, 'infra' FROM memories WHERE hash(id) % 7 = 0")
    with Store.open(path, read_only=True) as store:
        con = store.con
        texts = in_scope_texts(con, Scope())
        assert len(texts) == N
        drawn = synth.queries_from_texts(texts, 400, seed=9)
        answered = full = 0
        for q in HANDWRITTEN + SCRIPT_QUERIES + drawn:
            got = fulltext.search(con, q, Scope(), 10, fts)
            same, why = same_ranking(match_bm25(con, q, Scope(), 30, fts), got, 10)
            assert same, (q, why)
            if q in drawn:
                answered += bool(got)
                full += len(got) == 10
        # each drawn query starts with a word of a stored text, so none is empty;
        # most fill a top-10 (seed 9: 354 of 400; the rest are rare words alone)
        assert answered == len(drawn)
        assert full >= 0.85 * len(drawn), full
        scoped = check_scoped(con, fts, scope_combinations(con, NAMESPACES, TYPES), 2, seed=90)
        assert scoped == 192
        assert answered + scoped >= 500
