"""The demo corpus generator keeps its promises: deterministic, valid, judged."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import UTC, datetime

import pytest

from pipeline.datasets.demo import generate_corpus, generate_queries

REQUIRED = {
    "id": str,
    "namespace": str,
    "content": str,
    "content_type": str,
    "created_at": str,
    "topics": list,
    "concepts": list,
    "supersedes": list,
    "conflicts": list,
    "supported_by": list,
    "metadata": dict,
}
EDGES = ("supersedes", "conflicts", "supported_by")
PERIOD = (datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 10, 1, tzinfo=UTC))


def _when(record: dict) -> datetime:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["created_at"]), record["created_at"]
    return datetime.fromisoformat(record["created_at"].replace("Z", "+00:00"))


def _chains(corpus: list[dict]) -> list[list[str]]:
    """Maximal supersession chains, oldest first."""
    successor = {old: r["id"] for r in corpus for old in r["supersedes"]}
    heads = [r["id"] for r in corpus if r["supersedes"] and r["id"] not in successor]
    by_id = {r["id"]: r for r in corpus}
    chains = []
    for head in heads:
        chain = [head]
        while by_id[chain[-1]]["supersedes"]:
            chain.append(by_id[chain[-1]]["supersedes"][0])
        chains.append(chain[::-1])
    return chains


def _mentions(identifier: str, content: str) -> bool:
    # Word-ish boundaries so "db-1" does not count as a mention inside "db-17".
    return re.search(rf"(?<![\w.\-/]){re.escape(identifier)}(?![\w\-])", content) is not None


# The default seed is what users see; two more seeds check the promises are not luck.
@pytest.fixture(scope="module", params=[7, 1, 2])
def seed(request: pytest.FixtureRequest) -> int:
    return request.param


@pytest.fixture(scope="module")
def corpus(seed: int) -> list[dict]:
    return generate_corpus(seed)


@pytest.fixture(scope="module")
def judged(corpus: list[dict], seed: int) -> tuple[list[dict], dict[str, dict[str, int]]]:
    return generate_queries(corpus, seed)


def test_deterministic_for_a_seed_and_seed_sensitive() -> None:
    first, second = generate_corpus(7), generate_corpus(7)
    assert json.dumps(first, ensure_ascii=False) == json.dumps(second, ensure_ascii=False)
    assert generate_queries(first, 7) == generate_queries(second, 7)
    assert generate_corpus(8) != first


def test_records_are_valid(corpus: list[dict]) -> None:
    assert 350 <= len(corpus) <= 450
    ids = [r["id"] for r in corpus]
    assert len(ids) == len(set(ids))
    known = set(ids)
    for r in corpus:
        assert set(r) == set(REQUIRED)
        for name, kind in REQUIRED.items():
            assert isinstance(r[name], kind), (r["id"], name)
        assert r["content"].strip() and r["content_type"].strip()
        assert PERIOD[0] <= _when(r) < PERIOD[1]
        assert 1 <= len(r["topics"]) <= 2 and len(r["concepts"]) <= 3, r["id"]
        assert all(isinstance(t, str) and t for t in r["topics"] + r["concepts"])
        prefix = {"code": "code-", "messages": "msg-"}[r["namespace"]]
        assert re.fullmatch(rf"{prefix}\d{{4}}", r["id"])
        for edge in EDGES:
            assert all(isinstance(t, str) for t in r[edge])
            assert r["id"] not in r[edge], (r["id"], edge)
            assert set(r[edge]) <= known, (r["id"], edge)
            for target in r[edge]:
                assert target.split("-")[0] == r["id"].split("-")[0], "edges stay within a namespace"


def test_records_pass_the_ingest_model(corpus: list[dict]) -> None:
    from pipeline.store import ingest
    for r in corpus:
        ingest.MemoryRecord.model_validate(r)


def test_shape_counts(corpus: list[dict]) -> None:
    assert Counter(r["namespace"] for r in corpus).keys() == {"code", "messages"}
    types = {(r["namespace"], r["content_type"]) for r in corpus}
    assert {t for ns, t in types if ns == "code"} >= {"text", "code", "log", "decision"}
    assert {t for ns, t in types if ns == "messages"} >= {"text", "chat", "note"}
    assert len({t for _, t in types}) >= 5
    conflicts = sum(len(r["conflicts"]) for r in corpus)
    supports = sum(len(r["supported_by"]) for r in corpus)
    assert conflicts >= 10 and supports >= 15
    assert len({c for r in corpus for c in r["concepts"]}) >= 20


def test_supersession_chains(corpus: list[dict]) -> None:
    by_id = {r["id"]: r for r in corpus}
    chains = _chains(corpus)
    assert len(chains) >= 15
    assert {len(c) for c in chains} <= {2, 3}
    for chain in chains:
        assert len({by_id[m]["namespace"] for m in chain}) == 1
        times = [_when(by_id[m]) for m in chain]
        assert all(a < b for a, b in zip(times, times[1:])), chain
    # Every memory supersedes at most one and is superseded at most once: chains, not trees.
    targets = [t for r in corpus for t in r["supersedes"]]
    assert len(targets) == len(set(targets))
    assert all(len(r["supersedes"]) <= 1 for r in corpus)


def test_conflicts_and_supports_point_backwards_in_time(corpus: list[dict]) -> None:
    by_id = {r["id"]: r for r in corpus}
    for r in corpus:
        for target in r["conflicts"] + r["supported_by"]:
            assert _when(by_id[target]) <= _when(r)


def test_identifiers_are_embedded(corpus: list[dict]) -> None:
    text = "\n".join(r["content"] for r in corpus)
    for literal in ("ERR_CONN_RESET", "E1042", "OOMKilled", "deploy/helm/values.yaml", "src/app/main.py"):
        assert literal in text
    for pattern in (r"\bJIRA-\d{4}\b", r"\bv\d+\.\d+\.\d+\b", r"\bdb-\d+\b", r"\b[a-z]+-\d+\.internal\b"):
        assert len(set(re.findall(pattern, text))) >= 5, pattern


def test_queries_shape_and_judgments(corpus: list[dict], judged: tuple) -> None:
    queries, qrels = judged
    assert 60 <= len(queries) <= 80
    assert [q["id"] for q in queries] == [f"q{n:03d}" for n in range(1, len(queries) + 1)]
    assert len({q["text"] for q in queries}) == len(queries)
    kinds = Counter(q["kind"] for q in queries)
    assert set(kinds) == {"identifier", "paraphrase", "topical"}
    assert min(kinds.values()) >= 10
    assert {q["namespace"] for q in queries} == {"code", "messages", None}
    by_id = {r["id"]: r for r in corpus}
    assert set(qrels) == {q["id"] for q in queries}
    for q in queries:
        assert set(q) == {"id", "text", "namespace", "kind"}
        rel = qrels[q["id"]]
        assert rel, q
        assert set(rel) <= set(by_id), q
        assert set(rel.values()) <= {1, 2}
        if q["namespace"] is not None:
            assert {by_id[m]["namespace"] for m in rel} == {q["namespace"]}, q


def test_identifier_queries_have_a_literal_answer(corpus: list[dict], judged: tuple) -> None:
    queries, qrels = judged
    by_id = {r["id"]: r for r in corpus}
    for q in (q for q in queries if q["kind"] == "identifier"):
        rel = qrels[q["id"]]
        assert 2 in rel.values()
        tokens = [t.rstrip("?,.") for t in q["text"].split()]
        # An identifier token has a digit, a separator or inner capitals (OOMKilled); words have none.
        idents = [t for t in tokens if any(ch.isdigit() or ch in "_/.-" for ch in t) or any(ch.isupper() for ch in t[1:])]
        assert idents, q
        # The identifier appears in a relevant memory, and every memory that mentions it is judged.
        ident = max(idents, key=len)
        assert any(ident in by_id[m]["content"] for m in rel), q
        mentioning = {r["id"] for r in corpus if _mentions(ident, r["content"])}
        assert mentioning == set(rel), q


def test_chain_heads_are_the_best_answer(corpus: list[dict], judged: tuple) -> None:
    queries, qrels = judged
    heads = {c[-1] for c in _chains(corpus)}
    superseded = {c for chain in _chains(corpus) for c in chain[:-1]}
    graded_chain_queries = 0
    for q in queries:
        rel = qrels[q["id"]]
        if q["kind"] == "paraphrase" and set(rel) & heads and set(rel) <= heads | superseded:
            graded_chain_queries += 1
            assert all(rel[m] == 2 for m in set(rel) & heads)
            assert all(rel[m] == 1 for m in set(rel) & superseded)
    assert graded_chain_queries >= 15


def test_queries_refuse_a_foreign_corpus(corpus: list[dict], seed: int) -> None:
    with pytest.raises(ValueError):
        generate_queries(corpus, seed=seed + 100)
    with pytest.raises(ValueError):
        generate_queries([], seed=seed)




