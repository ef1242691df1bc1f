"""The query's IDF sum on a real store (``query_idf``, what issue 16's lexical
match divided by): each term counted by its live document frequency (base and
deltas), a term no memory holds with df 0, stopwords not at all. Both
postings paths agree."""

from __future__ import annotations

import pytest

from pipeline.store.fulltext import idf as bm25_idf
from pipeline.store.fulltext import query_idf
from tests.conftest import write_jsonl
from workers.cli.common import ingest_file


def _records():
    recs = [{"id": f"m{i:02d}", "namespace": "n", "content": f"routine note {i} about the weekly planning"}
            for i in range(30)]
    recs.append({"id": "ticket", "namespace": "n", "content": "incident zq7731 closed"})
    return recs


def test_query_idf_counts_live_dfs_and_skips_stopwords(embedded, tmp_path):
    from workers import resources
    from workers.api import remember

    ingest_file(write_jsonl(tmp_path / "m.jsonl", _records()), embedded, progress=False)
    with resources.current().view() as v:
        n = v.overlay.live_stats()[0]
        assert n == 31
        for postings in (v.postings(), None):  # in memory, and by SQL
            got = query_idf(v.cursor, "the weekly zq7731 of nowhereword", embedded.fulltext, v.overlay, postings)
            assert got == pytest.approx(bm25_idf(30, n) + bm25_idf(1, n) + bm25_idf(0, n))
    remember([{"id": "late", "namespace": "n", "content": "zq7731 reopened"}])  # a delta
    with resources.current().view() as v:
        n = v.overlay.live_stats()[0]
        assert n == 32
        got = query_idf(v.cursor, "zq7731", embedded.fulltext, v.overlay, v.postings())
        assert got == pytest.approx(bm25_idf(2, n))
