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
from pipeline.store import fulltext
from pipeline.store.database import Store
from pipeline.store.fulltext import Postings, index_exists

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
             "Café naïve résumé", "running the runner runs", "ERR_CONN_RESET ERR_CONN_RESET twice",
             "we ate pizza by the quay"]
    for text in extra:
        docs[rng.randrange(len(docs))] = text
    path = settings.data_dir / "store.duckdb"
    # namespace and content type drawn independently, so every combination holds memories
    labels = random.Random(6)
    synth.build_store(path, len(docs), settings, dim=16, docs=docs, log=lambda *_: None,
                      namespace_of=[NAMESPACES[labels.randrange(3)] for _ in docs],
                      content_type_of=[TYPES[labels.randrange(3)] for _ in docs])
    store = Store.open(path, read_only=False)
    # user topics and concepts for the scope filters (by a hash of the id: independent of both)
    store.con.execute("INSERT INTO memory_topics SELECT id, 'deploy', 'user' FROM memories WHERE hash(id) % 5 = 0")
    store.con.execute("INSERT INTO memory_concepts SELECT id, 'infra' FROM memories WHERE hash(id) % 7 = 0")
    yield store, settings.fulltext
    store.close()


@pytest.fixture(scope="module", params=["sql", "postings in memory"])
def leg(request, corpus):
    """The full-text leg as it scores from SQL, and from the base's postings
    held in memory (``pipeline.store.fulltext.postings``): both must equal ``match_bm25``."""
    if request.param == "sql":
        return fulltext.search
    postings = Postings.load(corpus[0].con)
    return lambda con, q, scope, k, fts: fulltext.search(con, q, scope, k, fts, postings)


NAMESPACES = ["ns0", "ns1", "ns2"]
TYPES = ["text", "code", "decision"]


def tree_topics(con, namespace: str) -> tuple[str, str]:
    """An inner topic of ``namespace``'s tree below its root (a strict part of the
    namespace) and a leaf elsewhere in it: the largest of each."""
    inner = con.execute(
        "SELECT t.topic_key FROM topics t JOIN topics up ON up.topic_key = t.parent "
        "WHERE t.namespace = ? AND NOT t.is_leaf AND up.parent IS NOT NULL AND up.namespace IS NOT NULL "
        "ORDER BY t.size DESC, t.topic_key LIMIT 1", [namespace]).fetchone()[0]
    leaf = con.execute(
        "SELECT topic_key FROM topics WHERE namespace = ? AND is_leaf AND parent <> ? "
        "ORDER BY size DESC, topic_key LIMIT 1", [namespace, inner]).fetchone()[0]
    return inner, leaf


def scope_combinations(con, namespaces: list[str], types: list[str]) -> list[Scope]:
    """Every namespace (and none) x content types (none, one, two) x topics (none,
    a user topic, an inner tree topic, a leaf or a user topic) x concepts (none,
    one): each combination a scope that holds memories (checked by the caller)."""
    scopes = []
    for ns in [None, *namespaces]:
        inner, leaf = tree_topics(con, ns or namespaces[1])
        for ct in [(), (types[1],), (types[1], types[2])]:
            for topics in [(), ("deploy",), (inner,), (leaf, "deploy")]:
                for concepts in [(), ("infra",)]:
                    scopes.append(Scope(namespace=ns, content_types=ct, topics=topics, concepts=concepts))
    return scopes


def in_scope_texts(con, scope: Scope) -> list[str]:
    """The texts of the memories ``scope`` holds, read straight from the tables
    (not through either side being compared)."""
    return [r[0] for r in con.execute(
        "SELECT fts_text FROM memories m WHERE ($ns IS NULL OR m.namespace = $ns) "
        "AND (len($types) = 0 OR list_contains($types, m.content_type)) "
        "AND (len($topics) = 0 OR m.id IN (SELECT memory_id FROM memory_topics WHERE list_contains($topics, topic_key))) "
        "AND (len($concepts) = 0 OR m.id IN (SELECT memory_id FROM memory_concepts WHERE list_contains($concepts, concept))) "
        "ORDER BY m.id",
        {"ns": scope.namespace, "types": list(scope.content_types), "topics": list(scope.topics),
         "concepts": list(scope.concepts)}).fetchall()]


def check_scoped(con, fts, scopes: list[Scope], per_scope: int, seed: int, search=fulltext.search) -> int:
    """Each scope holds memories; queries drawn from its own texts rank the same
    by the leg and by ``match_bm25``. Returns the number of non-empty answers."""
    answered = 0
    for i, scope in enumerate(scopes):
        texts = in_scope_texts(con, scope)
        assert texts, scope  # no combination is empty by construction
        for q in synth.queries_from_texts(texts, per_scope, seed=seed + i):
            got = search(con, q, scope, 10, fts)
            same, why = same_ranking(match_bm25(con, q, scope, 30, fts), got, 10)
            assert same, (q, scope, why)
            assert got, (q, scope)  # its first word is in a text of the scope
            answered += 1
    return answered


def _queries(n: int, seed: int) -> list[str]:
    return HANDWRITTEN + synth.queries(n, seed=seed, corpus_seed=3)


def test_rankings_and_scores_equal_match_bm25(leg, corpus):
    store, fts = corpus
    mismatches = []
    queries = _queries(80, seed=1)  # 500 more at 20,000 memories in the slow tier
    hits = 0
    for q in queries:
        got = leg(store.con, q, Scope(), 20, fts)
        ref = match_bm25(store.con, q, Scope(), 40, fts)
        hits += bool(got)
        same, why = same_ranking(ref, got, 20)
        if not same:
            mismatches.append((q, why))
    assert not mismatches, mismatches[:5]
    assert hits > len(queries) * 0.8  # the queries do hit: this compares rankings, not empty lists


@pytest.mark.parametrize("k1,b", [(1.2, 0.75), (2.0, 0.0)])  # the extension's defaults; no length norm
def test_equal_for_other_bm25_parameters(leg, corpus, k1, b):
    store, fts = corpus
    fts = fts.model_copy(update={"k1": k1, "b": b})
    for q in synth.queries(20, seed=int(k1 * 10 + b * 100), corpus_seed=3):
        same, why = same_ranking(match_bm25(store.con, q, Scope(), 30, fts), leg(store.con, q, Scope(), 10, fts), 10)
        assert same, (q, why)


def test_scoped_rankings_equal_match_bm25(leg, corpus):
    store, fts = corpus
    scopes = scope_combinations(store.con, NAMESPACES, TYPES)
    assert check_scoped(store.con, fts, scopes, 1, seed=2, search=leg) == len(scopes) == 96
    for scope in (Scope(namespace="nope"), Scope(topics=("nope",)), Scope(content_types=("nope",))):  # empty scopes
        for q in synth.queries_from_texts(in_scope_texts(store.con, Scope()), 5, seed=4):
            assert leg(store.con, q, scope, 10, fts) == [] == match_bm25(store.con, q, scope, 30, fts)


def test_identifiers_find_their_memory(leg, corpus):
    store, fts = corpus
    for q, expected in (("ERR_CONN_RESET", "ERR_CONN_RESET ERR_CONN_RESET twice"), ("src/app/main.py", "src/app/main.py crashed"),
                        ("cafe naive resume", "Café naïve résumé")):
        top = leg(store.con, q, Scope(), 1, fts)[0][0]
        assert store.con.execute("SELECT content FROM memories WHERE id = ?", [top]).fetchone()[0] == expected


def test_a_querys_stopwords_match_nothing(leg, corpus):
    """"at" is a stopword and the stem of "ate": the index dropped a memory's
    stopwords before stemming, so its "at" stands for "ate", and a query's
    own "at" (or "àt", through the SQL tokenizer) must not find it."""
    store, fts = corpus
    ate = store.con.execute("SELECT id FROM memories WHERE content = 'we ate pizza by the quay'").fetchone()[0]
    assert store.con.execute("SELECT count(*) FROM fts_main_memories.dict WHERE term = 'at'").fetchone()[0] == 1
    for q in ("at", "àt", "at the", "AT"):
        assert leg(store.con, q, Scope(), 5, fts) == [], q
    assert leg(store.con, "ate", Scope(), 1, fts)[0][0] == ate
    assert leg(store.con, "what we ate at the quay", Scope(), 1, fts)[0][0] == ate
    got = leg(store.con, "pizza at noon", Scope(), 50, fts)
    assert got[0][0] == ate and len(got) == len(leg(store.con, "pizza noon", Scope(), 50, fts))


def test_postings_follow_ingest(settings, tmp_path):
    """What ingest writes is searchable at once; an update replaces its postings."""
    from pipeline.store.ingest import parse_lines
    from pipeline.store.writes import write
    from tests.stores import compacted

    def ingest(lines):
        write(settings, parse_lines(lines, settings.limits))

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




# memories in several scripts, each sentence a memory; words repeat across them so df and tf vary
SCRIPT_TEXTS = [
    "Встреча в Москве перенесена на пятницу.", "В Москве идёт снег, встреча отменена.", "Новый план: новая встреча в пятницу",
    "Отчёт о продажах готов, который ждали.", "Η συνάντηση στην Αθήνα μετατέθηκε για την Παρασκευή.",
    "Βρέχει στην Αθήνα, η συνάντηση ακυρώθηκε.", "تم نقل الاجتماع في القاهرة إلى يوم الجمعة.",
    "الجو حار في القاهرة اليوم والاجتماع ملغى.", "東京の会議は金曜日に移動しました。", "明日の会議の資料を送ります。会議室はB。",
    "ガス料金とカス", "北京的会议改到星期五了。", "明天的会议取消了，会议室空了。", "서울 회의는 금요일로 옮겨졌습니다.",
    "काम कम है", "München café naïve, TNF-α 5 µm", "第3回 review", "Москва 東京 Αθήνα mixed ERR_CONN_RESET",
    "会議はＺＯＯＭで、ｶﾞｽの点検は３時。",
]
SCRIPT_QUERIES = [
    "Москве", "москва", "встреча пятницу", "новая", "который", "идет", "Αθήνα", "αθηνα συνάντηση", "Παρασκευή",
    "القاهرة", "بالقاهرة الاجتماع", "会議", "東京の会議", "金曜日", "会議室", "ガス", "カス", "会议", "星期五", "会", "回",
    "회의", "금요일로", "काम", "कम", "munchen cafe", "α", "µm", "Москва ERR_CONN_RESET 東京", "ＺＯＯＭ", "ｶﾞｽ", "。", "",
]


@pytest.mark.parametrize("stemmer", ["porter", "russian", "greek", "arabic", "none"])
def test_every_script_equals_match_bm25(tmp_path, stemmer):
    """Non-Latin text scores as the extension's ``match_bm25`` scores it over
    the same (``analyze``d) text, with each snowball stemmer, from SQL and from
    the postings in memory; every query whose words a memory holds finds it."""
    from pipeline.settings import Settings

    settings = Settings(data_dir=tmp_path, embedding_model="hash-64", fulltext={"stemmer": stemmer}, _env_file=None)
    docs = synth.texts(200, seed=3) + SCRIPT_TEXTS
    synth.build_store(tmp_path / "store.duckdb", len(docs), settings, dim=16, docs=docs, log=lambda *_: None)
    fts = settings.fulltext
    with Store.open(tmp_path / "store.duckdb", read_only=True) as store:
        postings = Postings.load(store.con)
        for q in SCRIPT_QUERIES:
            ref = match_bm25(store.con, q, Scope(), 40, fts)
            for got in (fulltext.search(store.con, q, Scope(), 20, fts),
                        fulltext.search(store.con, q, Scope(), 20, fts, postings)):
                same, why = same_ranking(ref, got, 20)
                assert same, (q, why)
            # a word is found, a lone Han character too, inside a run (会 of 会議) or
            # standing alone (回 in 第3回); punctuation alone is no term
            assert bool(ref) == (q not in ("。", "")), q
        # a mark that makes a letter stays in its word: a vowel sign, kana voicing, й
        assert fulltext.query_terms(store.con, "काम", fts) == ["काम"]
        assert fulltext.query_terms(store.con, "ガス", fts) != fulltext.query_terms(store.con, "カス", fts)
        assert fulltext.query_terms(store.con, "Новый", fts) == [{"russian": "нов"}.get(stemmer, "новый")]



def test_the_delta_tokenizer_answers_each_thread_for_its_own_texts():
    """On the lake a process's writes and its follower's threads build deltas
    at once: each call gets its own texts' terms, as when called alone."""
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.settings import FulltextSettings
    from pipeline.store.fulltext.terms import tokenize

    fs = FulltextSettings()
    texts = [[f"memory {i} about topic {j} and deploys" for j in range(i % 5 + 1)] + [f"Встреча {i} в Москве"]
             for i in range(60)] + [[]]  # ASCII counted in Python, the rest by the extension's index
    alone = [tokenize(t, fs) for t in texts]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda t: tokenize(t, fs), texts))
    assert together == alone


def test_a_stopword_read_the_deadline_interrupts_is_not_taken_for_no_stopwords():
    """A base keeps the query rule it reads first (``Postings.query_terms``):
    a read of its stopwords that the query's deadline interrupted raises (the
    leg times out) rather than giving a rule without stopwords, under which
    "at" would find "ate"; a connection with no index has none to read."""
    import duckdb

    from pipeline.settings import FulltextSettings
    from pipeline.store.fulltext.terms import QueryTerms, stopwords

    class Interrupted:
        def execute(self, *args, **kwargs):
            raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    with pytest.raises(duckdb.InterruptException):
        QueryTerms.of(Interrupted(), FulltextSettings())
    con = duckdb.connect()
    try:
        assert stopwords(con) is None
    finally:
        con.close()
