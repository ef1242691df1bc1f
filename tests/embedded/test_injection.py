"""Injection: namespaces, topic keys, concepts, content types and query texts
made of SQL and full-text syntax do nothing beyond a normal search for those
strings (issue 8).

A memory whose namespace is literally ``x' OR '1'='1`` is found by that exact
namespace and by no other; a query text full of quotes, ``;``, ``--``, ``*``
and ``OR`` returns what the same words without the punctuation return; the
store is byte for byte unchanged afterwards.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.settings import Settings, TreeSettings
from tests.conftest import write_jsonl
from tests.figures import case, count, refused
from tests.hostile import EVIL, REFUSED

# Labels must fit the ingest limits (namespace 256, content type 128 characters).
LABELS = sorted({s[:120] for s in EVIL if s.strip()})
VICTIM = "victim"


def _records() -> list[dict]:
    recs = [{"id": f"evil-{i}", "namespace": s, "content_type": s, "topics": [s], "concepts": [s],
             "content": f"deploy window note {i} {s}"} for i, s in enumerate(LABELS)]
    recs += [{"id": f"victim-{i}", "namespace": VICTIM, "content_type": "secret", "topics": ["private"],
              "concepts": ["private"], "content": f"deploy window secret {i} password"} for i in range(5)]
    # an evil-namespace memory that supersedes a victim: its link must not show in victim's scope
    recs.append({"id": "evil-link", "namespace": LABELS[0], "content_type": "text", "content": "deploy window override",
                 "supersedes": ["victim-0"], "conflicts": ["victim-1"], "topics": [LABELS[0]], "concepts": [LABELS[0]]})
    return recs


RECORDS = _records()


def _checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory) -> Settings:
    from workers.cli import ingest_file

    data = tmp_path_factory.mktemp("inject")
    # Beam and leaves wide enough that the vector leg scores every in-scope memory,
    # so a scoped hybrid query must return exactly the memories inside the scope.
    settings = Settings(data_dir=data / "data", embedding_model="hash-64", _env_file=None, audit_enabled=False,
                        tree=TreeSettings(beam_width=64, max_leaf_items=64))
    ingest_file(write_jsonl(data / "hostile.jsonl", RECORDS), settings, progress=False)
    return settings


@pytest.fixture
def hs(hostile_store):
    import workers
    from workers import resources

    workers.configure(hostile_store)
    before = _checksum(hostile_store.store_path)
    yield hostile_store
    resources.close_store()
    assert _checksum(hostile_store.store_path) == before  # nothing was written, dropped or altered


def _expected(field: str, value: str) -> set[str]:
    key = {"namespace": "namespace", "content_type": "content_type"}.get(field)
    if key:
        return {r["id"] for r in RECORDS if r.get(key, "text") == value}
    return {r["id"] for r in RECORDS if value in r.get(field, [])}


@pytest.mark.parametrize("field", ["namespace", "topics", "concepts", "content_type"])
def test_hostile_labels_scope_exactly(hs, field):
    """Each hostile label finds exactly the memories carrying it: nothing more, nothing less."""
    from workers.api import search_many

    asks = [{"query": "deploy window", field: (v if field in ("namespace", "content_type") else [v]), "max_units": 100}
            for v in LABELS]
    for value, res in zip(LABELS, search_many(asks)):
        with case("injection.labels"):
            got = {r.id for r in res.results}
            assert got == _expected(field, value), (field, value)
            for r in res.results:
                for link in (*r.superseded_by, *r.conflicts, *r.supported_by):
                    assert link.id in _expected(field, value), (field, value, link.id)
            count("injection.labels", "results checked", len(got))


def test_the_namespace_x_or_1_equals_1_is_found_only_by_itself(hs):
    from workers.api import search

    evil = "x' OR '1'='1"
    mine = _expected("namespace", evil)
    assert mine  # the store holds it
    for mode in ("keyword", "semantic", "hybrid"):
        assert {r.id for r in search("deploy window", namespace=evil, mode=mode, max_units=100).results} <= mine
    for near in ("x", "x'", "1", "'1'='1", "x' OR '1'='1'", "X' OR '1'='1", " x' OR '1'='1", "%", "*"):
        got = {r.id for r in search("deploy window", namespace=near, max_units=100).results}
        assert not got & mine, near
        assert got == _expected("namespace", near)


def test_victim_scope_never_shows_evil_links(hs):
    """The evil memory supersedes and conflicts with victims; in the victim's scope
    neither the evil memory nor its links appear."""
    from workers.api import search

    unscoped = {r.id: r for r in search("deploy window secret override", max_units=100).results}
    assert "evil-link" in [l.id for l in unscoped["victim-0"].superseded_by]  # the link exists
    for mode in ("keyword", "semantic", "hybrid"):
        res = search("deploy window secret override", namespace=VICTIM, mode=mode, max_units=100)
        assert {r.id for r in res.results} <= _expected("namespace", VICTIM)
        assert all(l.id.startswith("victim-") for r in res.results for l in (*r.superseded_by, *r.conflicts))


def _normal(text: str) -> str:
    """What the full-text analyzer keeps of ``text``: accents stripped, lower case,
    split at anything but [a-z0-9_] (settings.fulltext.ignore)."""
    flat = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c)).lower()
    return " ".join(t for t in re.split(r"[^a-z0-9_]+", flat) if t)


def test_query_text_syntax_is_just_words(hs):
    """A query made of SQL / FTS syntax returns what its plain words return
    (ASCII syntax: for other scripts the analyzer's accent folding is DuckDB's,
    not the ``_normal`` approximation here; those texts are fuzzed for errors)."""
    from workers.api import search_many

    mode = "keyword"
    syntax = [s for s in EVIL if s.strip() and s.isascii()]
    texts = syntax + [f"deploy {s} window" for s in syntax] + ["'" * 500, "%" * 10_000]
    hostile = search_many([{"query": t, "mode": mode, "max_units": 100} for t in texts])
    plain_texts = [_normal(t) for t in texts]
    asked = [(i, p) for i, p in enumerate(plain_texts) if p]
    plain = dict(zip([i for i, _ in asked], search_many([{"query": p, "mode": mode, "max_units": 100} for _, p in asked])))
    for i, (text, res) in enumerate(zip(texts, hostile)):
        with case("injection.query_text"):
            got = [(r.id, round(r.rrf, 9)) for r in res.results if "fts" in r.ranks]
            if i in plain:
                want = [(r.id, round(r.rrf, 9)) for r in plain[i].results if "fts" in r.ranks]
                assert got == want, text
            else:  # nothing but punctuation: no words to match
                assert got == [], text
            count("injection.query_text", "results compared", len(got))


@pytest.mark.parametrize("bad", REFUSED)
@pytest.mark.parametrize("field", ["query", "namespace", "topics", "concepts", "content_type"])
def test_nul_and_invalid_unicode_are_typed_errors(hs, field, bad):
    from workers.api import search

    with case("injection.refused"):
        with pytest.raises(InputError) as info:
            if field == "query":
                search(bad)
            else:
                search("deploy", **{field: bad if field == "namespace" else [bad]})
        assert info.value.field == field
        refused("injection.refused")


def test_stats_and_audit_show_hostile_labels_verbatim(hs, monkeypatch, capsys):
    """The CLI prints what is stored; a hostile namespace is data, not a command."""
    import json

    from workers.cli import main

    monkeypatch.setenv("DIMPLE_DATA_DIR", str(hs.data_dir))
    monkeypatch.setenv("DIMPLE_EMBEDDING_MODEL", "hash-64")
    from pipeline.settings import get_settings

    get_settings.cache_clear()
    try:
        assert main(["stats", "--json"]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert set(stats["by_namespace"]) == {r["namespace"] for r in RECORDS}
        assert stats["memories"] == len(RECORDS)
        assert main(["search", "deploy window", "--namespace", "'; DROP TABLE memories; --", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert {r["namespace"] for r in out["results"]} == {"'; DROP TABLE memories; --"}
    finally:
        get_settings.cache_clear()
