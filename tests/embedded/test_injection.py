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
import math
import re
import unicodedata
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.settings import Settings, TreeSettings
from tests.conftest import use_store, write_jsonl
from tests.figures import case, count, refused
from tests.hostile import EVIL, REFUSED
from workers.settings import WorkerSettings

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


def _checksums(settings: Settings) -> dict[str, str]:
    """Every file of the store, byte for byte: the lake's catalog, its data
    files and the bases built from it (not the host's cache of a base, which a
    reader derives from the base)."""
    catalog = Path(settings.lake_catalog.removeprefix("sqlite:"))
    files = [catalog] + [p for folder in (settings.lake_data_path, settings.lake_index_path)
                         for p in sorted(folder.rglob("*")) if p.is_file()]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory) -> Settings:
    from workers.cli.common import ingest_file

    data = tmp_path_factory.mktemp("inject")
    # Beam and leaves wide enough that the vector leg scores every in-scope memory,
    # so a scoped hybrid query must return exactly the memories inside the scope.
    # No audit: ``hs`` checks the store's files byte for byte after each test.
    settings = WorkerSettings(data_dir=data / "data", embedding_model="hash-64", _env_file=None, audit_enabled=False,
                              tree=TreeSettings(beam_width=64, max_leaf_items=64))
    ingest_file(write_jsonl(data / "hostile.jsonl", RECORDS), settings, progress=False)
    return settings


@pytest.fixture
def hs(hostile_store):
    import workers
    from workers import resources

    workers.configure(hostile_store)
    before = _checksums(hostile_store)
    yield hostile_store
    resources.current().close_store()
    assert _checksums(hostile_store) == before  # nothing was written, dropped or altered


def _expected(field: str, value: str) -> set[str]:
    key = {"namespace": "namespace", "content_type": "content_type"}.get(field)
    if key:
        return {r["id"] for r in RECORDS if r.get(key, "text") == value}
    return {r["id"] for r in RECORDS if value in r.get(field, [])}


MODES = ("keyword", "semantic", "hybrid")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("field", ["namespace", "topics", "concepts", "content_type"])
def test_hostile_labels_scope_exactly(hs, field, mode):
    """Each hostile label finds exactly the memories carrying it, in every mode:
    nothing more, nothing less (every record's content holds "deploy window",
    and the beam reaches every in-scope memory, so each leg alone finds them all)."""
    from workers.api import search_many

    asks = [{"query": "deploy window", "mode": mode, "max_units": 100,
             field: (v if field in ("namespace", "content_type") else [v])} for v in LABELS]
    for value, res in zip(LABELS, search_many(asks)):
        with case("injection.labels"):
            assert res.mode == mode
            got = {r.id for r in res.results}
            assert got == _expected(field, value), (field, value, mode)
            for r in res.results:
                for link in (*r.superseded_by, *r.conflicts, *r.supported_by):
                    assert link.id in _expected(field, value), (field, value, link.id)
            count("injection.labels", "results checked", len(got))


def test_the_namespace_x_or_1_equals_1_is_found_only_by_itself(hs):
    from workers.api import search

    evil = "x' OR '1'='1"
    mine = _expected("namespace", evil)
    assert mine  # the store holds it
    for mode in MODES:
        assert {r.id for r in search("deploy window", namespace=evil, mode=mode, max_units=100).results} == mine
        for near in ("x", "x'", "1", "'1'='1", "x' OR '1'='1'", "X' OR '1'='1", " x' OR '1'='1", "%", "*"):
            got = {r.id for r in search("deploy window", namespace=near, mode=mode, max_units=100).results}
            assert not got & mine, (near, mode)
            assert got == _expected("namespace", near), (near, mode)


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


def _bm25_hits(settings: Settings, text: str, mode: str) -> tuple[bool, list[tuple[str, float]]]:
    """The full-text leg's own output for ``text`` in ``mode``, through the query's
    declared stages (``run_local``, the canvas's answers: ``test_run_local``):
    whether the leg ran, and its (id, BM25 score) hits, best first. Fused scores
    are rank-derived (RRF), so they could agree while the BM25 scores differ."""
    from pipeline.contracts import Batch, make_query
    from pipeline.stages.registry import run_local
    from workers import resources

    query = make_query(text, {"mode": mode, "max_units": 100}, settings)
    leg = run_local(Batch(states=[{"query": query}]), resources.current()).states[0].legs["fts"]
    return leg.ran, [(h.id, h.score) for h in leg.hits]


def test_query_text_syntax_is_just_words(hs):
    """A query made of SQL / FTS syntax gets the BM25 scores its plain words get,
    in every mode that runs the full-text leg, and is answered in every mode
    (ASCII syntax: for other scripts the analyzer's accent folding is DuckDB's,
    not the ``_normal`` approximation here; those texts are fuzzed for errors)."""
    from workers.api import search_many

    syntax = [s for s in EVIL if s.strip() and s.isascii()]
    texts = syntax + [f"deploy {s} window" for s in syntax] + ["'" * 500, "%" * 10_000]
    with_words = 0
    for mode in MODES:
        answered = search_many([{"query": t, "mode": mode, "max_units": 100} for t in texts])
        assert [r.query for r in answered] == texts and all(r.mode == mode for r in answered)
        for text in texts:
            with case("injection.query_text"):
                ran, got = _bm25_hits(hs, text, mode)
                assert ran == (mode != "semantic"), (text, mode)
                plain = _normal(text)
                want = _bm25_hits(hs, plain, mode)[1] if plain else []  # nothing but punctuation: no words
                assert [i for i, _ in got] == [i for i, _ in want], (text, mode)
                assert all(math.isclose(a, b, rel_tol=1e-12) for (_, a), (_, b) in zip(got, want)), (text, mode)
                with_words += bool(got)
                count("injection.query_text", "BM25 hits compared", len(got))
    assert with_words >= len(syntax) * 2  # the "deploy ... window" texts hit in keyword and hybrid: not all empty


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

    use_store(monkeypatch, hs)
    from workers.settings import get_settings

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
