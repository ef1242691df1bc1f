"""The full-text leg against the DuckDB FTS extension's own ``match_bm25``:
same scores, same rankings, same scope filtering, over hundreds of random
queries (frequent and rare terms, stopwords, repeats, unknown words,
identifiers) on 2,000 synthetic memories (20,000 in the slow tier). That the
cost follows the postings read, not the store size, is a benchmark
(``ops/bench/fulltext.py``), not a timed test."""

from __future__ import annotations

import random

import pytest

from ops.bench import synth
from ops.bench.bm25_reference import match_bm25, same_ranking
from pipeline.contracts import Scope
from pipeline.stages import fulltext
from pipeline.store.database import Store
from pipeline.store.fulltext_index import index_exists

HANDWRITTEN = [
    "ERR_CONN_RESET", "err_conn_reset on db-17", "db-17", "db 17", "src/app/main.py", "main.py",
    "src/app/main.py db-17 ERR_CONN_RESET", "the", "the and of", "zzzunknownzzz", "ERR_CONN_RESET ERR_CONN_RESET",
    "Running runs ran runner", "DB-17!!!", "   spaced    out   ", "café naïve", "a", "_", "17",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from pipeline.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("fts"), embedding_model="hash-64", _env_file=None)
    docs = synth.texts(2000, seed=3)
    rng = random.Random(5)
    extra = ["ERR_CONN_RESET seen on db-17 after deploy", "db-17 is the staging host", "src/app/main.py crashed",
             "Café naïve résumé", "running the runner runs", "ERR_CONN_RESET ERR_CONN_RESET twice"]
    for text in extra:
        docs[rng.randrange(len(docs))] = text
    path = settings.data_dir / "store.duckdb"
    synth.build_store(path, len(docs), settings, namespaces=3, dim=16, docs=docs, log=lambda *_: None)
    store = Store.open(path, read_only=False)
    # user topics and concepts for the scope filters
    store.con.execute("INSERT INTO memory_topics SELECT id, 'deploy', 'user' FROM memories WHERE hash(id) % 5 = 0")
    store.con.execute("INSERT INTO memory_concepts SELECT id, 'infra' FROM memories WHERE hash(id) % 7 = 0")
    yield store, settings.fulltext
    store.close()


def _queries(n: int, seed: int) -> list[str]:
    return HANDWRITTEN + synth.queries(n, seed=seed, corpus_seed=3)


def test_rankings_and_scores_equal_match_bm25(corpus):
    store, fts = corpus
    mismatches = []
    queries = _queries(200, seed=1)
    hits = 0
    for q in queries:
        got = fulltext.search(store.con, q, Scope(), 20, fts)
        ref = match_bm25(store.con, q, Scope(), 40, fts)
        hits += bool(got)
        same, why = same_ranking(ref, got, 20)
        if not same:
            mismatches.append((q, why))
    assert not mismatches, mismatches[:5]
    assert hits > len(queries) * 0.8  # the queries do hit: this compares rankings, not empty lists


@pytest.mark.parametrize("k1,b", [(1.2, 0.75), (2.0, 0.0)])  # the extension's defaults; no length norm
def test_equal_for_other_bm25_parameters(corpus, k1, b):
    store, fts = corpus
    fts = fts.model_copy(update={"k1": k1, "b": b})
    for q in synth.queries(20, seed=int(k1 * 10 + b * 100), corpus_seed=3):
        same, why = same_ranking(match_bm25(store.con, q, Scope(), 30, fts), fulltext.search(store.con, q, Scope(), 10, fts), 10)
        assert same, (q, why)


def test_scoped_rankings_equal_match_bm25(corpus):
    store, fts = corpus
    tree_topic = store.con.execute(
        "SELECT topic_key FROM topics WHERE NOT is_leaf AND parent IS NOT NULL AND namespace = 'ns1' ORDER BY size DESC, topic_key LIMIT 1"
    ).fetchone()[0]
    scopes = [
        Scope(namespace="ns1"), Scope(namespace="nope"), Scope(content_types=("code",)),
        Scope(content_types=("code", "decision")), Scope(topics=("deploy",)), Scope(topics=(tree_topic,)),
        Scope(concepts=("infra",)), Scope(namespace="ns2", content_types=("text",), topics=("deploy",)),
    ]
    checked = 0
    for i, q in enumerate(synth.queries(64, seed=2, corpus_seed=3)):
        scope = scopes[i % len(scopes)]
        got = fulltext.search(store.con, q, scope, 10, fts)
        same, why = same_ranking(match_bm25(store.con, q, scope, 30, fts), got, 10)
        assert same, (q, scope, why)
        checked += bool(got)
    assert checked > 30


def test_identifiers_find_their_memory(corpus):
    store, fts = corpus
    for q, expected in (("ERR_CONN_RESET", "ERR_CONN_RESET ERR_CONN_RESET twice"), ("src/app/main.py", "src/app/main.py crashed"),
                        ("cafe naive resume", "Café naïve résumé")):
        top = fulltext.search(store.con, q, Scope(), 1, fts)[0][0]
        assert store.con.execute("SELECT content FROM memories WHERE id = ?", [top]).fetchone()[0] == expected


def test_postings_follow_ingest(settings, tmp_path):
    """What ingest writes is searchable at once; an update replaces its postings."""
    from pipeline.store.ingest import parse_lines
    from pipeline.store.writes import write_parsed
    from tests.stores import compacted

    def ingest(lines):
        write_parsed(parse_lines(lines, settings.limits), settings)

    ingest(['{"id": "a", "namespace": "n", "content": "alpha ERR_CONN_RESET"}',
            '{"id": "b", "namespace": "n", "content": "beta gamma"}'])
    with Store.open(compacted(settings), read_only=True) as st:
        assert [h[0] for h in fulltext.search(st.con, "ERR_CONN_RESET", Scope(), 5, settings.fulltext)] == ["a"]
    ingest(['{"id": "a", "namespace": "n", "content": "alpha only now"}',
            '{"id": "c", "namespace": "n", "content": "ERR_CONN_RESET again", "content_type": "log"}'])
    with Store.open(compacted(settings), read_only=True) as st:
        assert index_exists(st.con)
        assert [h[0] for h in fulltext.search(st.con, "ERR_CONN_RESET", Scope(), 5, settings.fulltext)] == ["c"]
        assert [h[0] for h in fulltext.search(st.con, "ERR_CONN_RESET", Scope(content_types=("text",)), 5, settings.fulltext)] == []
        ref = match_bm25(st.con, "alpha gamma again", Scope(), 10, settings.fulltext)
        assert same_ranking(ref, fulltext.search(st.con, "alpha gamma again", Scope(), 10, settings.fulltext), 10)[0]


