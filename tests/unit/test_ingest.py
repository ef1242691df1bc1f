"""Ingest: validation of every bad line, all-or-nothing writes, updates, the CLI."""

from __future__ import annotations

import json

import pytest

from pipeline.embedders import HashEmbedder
from pipeline.errors import IngestValidationError, InputError
from pipeline.store import ingest
from pipeline.store.database import Store
from pipeline.store.stats import store_stats
from tests.conftest import write_jsonl
from tests.stores import compacted, published
from workers.cli import main
from workers.cli.common import ingest_file, store_exists


def _mem(i, ns="alpha", **kw):
    rec = {"id": f"m{i}", "namespace": ns, "content": f"memory number {i} about topic {i % 7}",
           "content_type": "text", "created_at": "2025-01-01T00:00:00Z"}
    rec.update(kw)
    return rec


@pytest.fixture
def store_with_base(settings, tmp_path):
    ingest_file(write_jsonl(tmp_path / "base.jsonl", [_mem(i) for i in range(40)]), settings, progress=False)
    return settings


BAD_LINES = [
    ("{not json", "<json>", "malformed JSON"),
    (json.dumps({"content": "no namespace"}), "namespace", "Field required"),
    (json.dumps({"namespace": 5, "content": "x"}), "namespace", "valid string"),
    (json.dumps({"namespace": "a", "content": "x", "topics": "deploy"}), "topics", "valid list"),
    (json.dumps({"namespace": "a", "content": "x" * 30_001}), "content", "over the limit"),
    (json.dumps({"namespace": "a", "content": "x", "supersedes": ["nope-404"]}), "supersedes", "unknown memory id"),
    (json.dumps({"namespace": "a", "content": "x", "colour": "red"}), "colour", "Extra inputs"),
    (json.dumps([1, 2]), "<json>", "JSON object"),
    (json.dumps({"namespace": "a", "content": "x", "created_at": 12345}), "created_at", "ISO 8601"),
    (json.dumps({"namespace": "a", "content": "x", "created_at": 1.7e12}), "created_at", "ambiguous"),
    (json.dumps({"namespace": "a", "content": "x", "created_at": "1733000000"}), "created_at", "ambiguous"),
    # an id forget, get and links would refuse: written, it could never be forgotten
    (json.dumps({"id": "   ", "namespace": "a", "content": "x"}), "id", "must be a memory id"),
]


@pytest.mark.parametrize("line,field,reason", BAD_LINES)
def test_each_bad_line_is_reported_and_nothing_is_written(store_with_base, tmp_path, line, field, reason):
    settings = store_with_base.replace(limits={"max_content_chars": 30_000 - 1})
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_mem(100)) + "\n" + line + "\n", encoding="utf-8")
    before = published(settings)
    with pytest.raises(IngestValidationError) as info:
        ingest_file(path, settings, progress=False)
    errors = info.value.errors
    assert [(e.line, e.field) for e in errors] == [(2, field)]
    assert reason in errors[0].reason
    assert published(settings) == before


def test_a_file_with_a_byte_order_mark_ingests(settings, tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes("\ufeff".encode() + "\n".join(json.dumps(_mem(i)) for i in range(3)).encode() + b"\n")
    report = ingest_file(path, settings, progress=False)
    assert report.inserted == 3


def test_duplicate_id_in_one_file_names_both_lines(settings, tmp_path):
    path = write_jsonl(tmp_path / "dup.jsonl", [_mem(1), _mem(2), _mem(1, content="again")])
    with pytest.raises(IngestValidationError) as info:
        ingest_file(path, settings, progress=False)
    (err,) = info.value.errors
    assert (err.line, err.field) == (3, "id") and "first on line 1" in err.reason
    assert not store_exists(settings)  # nothing written


def test_all_errors_are_collected_not_just_the_first(settings, tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(["{bad", json.dumps({"content": "x"}), json.dumps(_mem(3)), "[]"]) + "\n")
    with pytest.raises(IngestValidationError) as info:
        ingest_file(path, settings, progress=False)
    assert [e.line for e in info.value.errors] == [1, 2, 4]


def test_missing_file_is_an_input_error(settings, tmp_path):
    with pytest.raises(InputError) as info:
        ingest_file(tmp_path / "nope.jsonl", settings)
    assert info.value.field == "FILE"


def test_skip_invalid_writes_the_rest_and_reports(settings, tmp_path):
    records = [_mem(1), {"namespace": "alpha"}, _mem(3, supersedes=["m1"]), _mem(4, supported_by=["ghost"])]
    report = ingest_file(write_jsonl(tmp_path / "mixed.jsonl", records), settings, skip_invalid=True, progress=False)
    assert report.inserted == 2
    assert sorted(e.line for e in report.skipped) == [2, 4]
    with Store.open(compacted(settings), read_only=True) as store:
        assert store.existing_ids(["m1", "m3", "m4"]) == {"m1", "m3"}


def test_edges_may_point_into_the_store_or_the_same_file(store_with_base, tmp_path):
    recs = [_mem(100, supersedes=["m1"]), _mem(101, conflicts=["m100"], supported_by=["m2"])]
    report = ingest_file(write_jsonl(tmp_path / "edges.jsonl", recs), store_with_base, progress=False)
    assert report.inserted == 2
    with Store.open(compacted(store_with_base), read_only=True) as store:
        edges = set(store.con.execute("SELECT src, dst, kind FROM edges").fetchall())
    assert edges == {("m100", "m1", "supersedes"), ("m101", "m100", "conflicts"), ("m2", "m101", "supports")}


def test_sent_in_batches_a_link_must_not_point_to_a_later_batch(store_with_base):
    """``dimple ingest --via-broker`` writes each batch on its own, in order: a
    link from line 1 to a memory on line 3, two lines a batch, would be
    refused by the worker writing the first batch after nothing was wrong
    here. So the whole file is refused first, naming the line; a link back,
    within a batch, or into the store is fine, and so is one into a later
    batch to a memory the store already holds."""
    lines = [json.dumps(r) for r in (_mem(100, supersedes=["m102"]), _mem(101, conflicts=["m100"]),
                                     _mem(102, supported_by=["m101"]), _mem(104, conflicts=["m2"]),
                                     _mem(103, supersedes=["m1"]), _mem(2, content="moved on"))]
    with Store.open(compacted(store_with_base), read_only=True) as store:
        parsed = ingest.parse_lines(lines, store_with_base.limits)
        with pytest.raises(IngestValidationError) as info:
            ingest.validate(parsed, store, skip_invalid=False, batch_size=2)
        (err,) = info.value.errors
        assert (err.line, err.field) == (1, "supersedes")
        assert "'m102' is on line 3, in a later batch" in err.reason and "batch of 2 lines" in err.reason
        for whole in (None, 3):  # one batch for lines 1-3, or the file written at once
            assert ingest.validate(ingest.parse_lines(lines, store_with_base.limits), store, False, batch_size=whole) == []


def test_reingest_updates_never_duplicates_and_reembeds_only_changes(store_with_base, tmp_path):
    s = store_with_base
    recs = [_mem(1), _mem(2, content="completely new words here"), _mem(3, content_type="note")]
    report = ingest_file(write_jsonl(tmp_path / "upd.jsonl", recs), s, progress=False)
    assert (report.inserted, report.updated, report.unchanged, report.embedded) == (0, 2, 1, 1)
    with Store.open(compacted(s), read_only=True) as store:
        assert store.count() == 40
        row = store.con.execute("SELECT content, content_type FROM memories WHERE id='m2'").fetchone()
        assert row == ("completely new words here", "text")
        assert store.con.execute("SELECT content_type FROM memories WHERE id='m3'").fetchone()[0] == "note"
        emb = store.con.execute("SELECT embedding FROM memories WHERE id='m2'").fetchone()[0]
        expected = HashEmbedder(64).embed(["completely new words here"])[0]
        assert max(abs(a - b) for a, b in zip(emb, expected)) < 1e-6
        leaf_rows = store.con.execute("SELECT count(*), count(DISTINCT memory_id) FROM memory_topics WHERE kind='leaf'").fetchone()
        assert leaf_rows == (40, 40)


def test_derived_ids_are_stable(settings, tmp_path):
    rec = {"namespace": "alpha", "content": "no id given"}
    ingest_file(write_jsonl(tmp_path / "a.jsonl", [rec]), settings, progress=False)
    report = ingest_file(write_jsonl(tmp_path / "b.jsonl", [rec]), settings, progress=False)
    assert (report.inserted, report.updated, report.unchanged) == (0, 0, 1)
    with Store.open(compacted(settings), read_only=True) as store:
        assert store.existing_ids([ingest.derive_id("alpha", "no id given")])


def test_ingest_reopen_stats(settings, tmp_path):
    recs = [_mem(i, ns=("alpha" if i % 3 else "beta"), content_type=("code" if i % 2 else "text")) for i in range(150)]
    ingest_file(write_jsonl(tmp_path / "m.jsonl", recs), settings, progress=False)
    with Store.open(compacted(settings), read_only=True) as store:
        stats = store_stats(store)
    assert stats["memories"] == 150
    assert stats["by_namespace"] == {"alpha": 100, "beta": 50}
    assert stats["by_content_type"] == {"code": 75, "text": 75}
    assert stats["tree"]["memories_in_leaves"] == 150
    assert 0 < stats["tree"]["largest_leaf"] <= settings.tree.max_leaf_items
    assert stats["fts"]["fresh"] is True






def test_config_masks_secrets(settings, monkeypatch, capsys):
    monkeypatch.setenv("DIMPLE_BROKER_URL", "redis://:hunter2@10.0.0.5:6379/0")
    monkeypatch.setenv("DIMPLE_RESULT_BACKEND", "rediss://user:s3cret@cache.internal:6380/1")
    from workers.settings import get_settings

    get_settings.cache_clear()
    try:
        assert main(["config"]) == 0
        out = capsys.readouterr().out
    finally:
        get_settings.cache_clear()
    data = json.loads(out)
    assert "hunter2" not in out and "s3cret" not in out
    assert data["broker_url"] == "redis://:****@10.0.0.5:6379/0"
    assert data["result_backend"] == "rediss://user:****@cache.internal:6380/1"
    from workers.settings import mask_url

    assert mask_url("redis://10.0.0.5:6379/0?password=hunter2&db=1") == "redis://10.0.0.5:6379/0?password=****&db=1"
    assert mask_url("redis://h/0?socket_timeout=5&Password=x#f") == "redis://h/0?socket_timeout=5&Password=****#f"


def test_messages_naming_the_lake_mask_the_catalog_password(settings):
    """``dimple tune`` (--show, --apply, --reset and its errors) names the lake
    it reads: never with the PostgreSQL catalog's password (was: as written)."""
    from pipeline.store import tuned

    pg = settings.replace(store=settings.store.model_copy(update={"catalog": "postgres:host=db dbname=d password=s3cret"}))
    assert tuned.where(pg) == "the lake at postgres:host=db dbname=d password=****"


def test_reindex_rebuilds_the_same_tree_and_keeps_search_working(settings, tmp_path, monkeypatch, capsys):
    recs = [_mem(i, ns=("alpha" if i % 2 else "beta")) for i in range(120)]
    ingest_file(write_jsonl(tmp_path / "m.jsonl", recs), settings, progress=False)
    # grow one namespace incrementally, then reindex from scratch
    more = [_mem(i, ns="alpha", content=f"late addition {i} with words") for i in range(200, 260)]
    ingest_file(write_jsonl(tmp_path / "more.jsonl", more), settings, progress=False)
    monkeypatch.setenv("DIMPLE_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("DIMPLE_EMBEDDING_MODEL", "hash-64")
    from workers.settings import get_settings

    def tree_rows():
        with Store.open(compacted(settings), read_only=True) as store:
            return sorted(store.con.execute("SELECT memory_id, topic_key FROM memory_topics WHERE kind='leaf'").fetchall())

    get_settings.cache_clear()
    try:
        assert main(["reindex"]) == 0
        first = tree_rows()
        assert main(["reindex"]) == 0
        assert tree_rows() == first  # deterministic
    finally:
        get_settings.cache_clear()
    assert len(first) == 180 and len({m for m, _ in first}) == 180
    with Store.open(compacted(settings), read_only=True) as store:
        stats = store_stats(store)
    assert stats["fts"]["fresh"] and stats["tree"]["largest_leaf"] <= settings.tree.max_leaf_items




# -- re-ingesting what the store holds writes nothing ---------------------------------------------
_published = published


def test_an_identical_file_writes_and_publishes_nothing(store_with_base, tmp_path, monkeypatch):
    import pipeline.embedders

    def no_model(*args, **kwargs):
        raise AssertionError("nothing to embed, yet a model was loaded")

    before = _published(store_with_base)
    monkeypatch.setattr(pipeline.embedders, "make_embedder", no_model)
    report = ingest_file(write_jsonl(tmp_path / "same.jsonl", [_mem(i) for i in range(40)]), store_with_base,
                         progress=False)
    assert (report.inserted, report.updated, report.unchanged, report.embedded) == (0, 0, 40, 0)
    assert report.version == before[0] and not report.compacted
    assert _published(store_with_base) == before  # the same manifest and segment files, byte for byte


def test_a_record_without_created_at_is_unchanged_when_nothing_else_is(settings, tmp_path):
    recs = [{"id": "x", "namespace": "alpha", "content": "no time given", "metadata": {"b": 1, "a": [1.5, True]}}]
    ingest_file(write_jsonl(tmp_path / "a.jsonl", recs), settings, progress=False)
    before = _published(settings)
    report = ingest_file(write_jsonl(tmp_path / "b.jsonl", recs), settings, progress=False)
    assert (report.inserted, report.updated, report.unchanged) == (0, 0, 1)
    assert _published(settings) == before


@pytest.mark.parametrize("change", [
    {"metadata": {"k": "v"}}, {"topics": ["t-new"]}, {"concepts": ["c-new"]}, {"supersedes": ["m2"]},
    {"conflicts": ["m3"]}, {"supported_by": ["m4"]}, {"context": "said at lunch"}, {"content_type": "note"},
    {"created_at": "2025-06-01T00:00:00Z"}, {"namespace": "beta"}, {"content": "other words"},
])
def test_any_change_of_a_record_is_an_update_and_a_new_generation(store_with_base, tmp_path, change):
    before = _published(store_with_base)
    recs = [_mem(1, **change), _mem(5)]
    report = ingest_file(write_jsonl(tmp_path / "c.jsonl", recs), store_with_base, progress=False)
    assert (report.inserted, report.updated, report.unchanged) == (0, 1, 1)
    after = _published(store_with_base)
    assert after[0] != before[0] and report.version == after[0]  # the store version the write published
    # and the same file again is now unchanged
    again = ingest_file(write_jsonl(tmp_path / "d.jsonl", recs), store_with_base, progress=False)
    assert (again.inserted, again.updated, again.unchanged) == (0, 0, 2)
    assert _published(store_with_base) == after


def test_dropping_an_annotation_is_an_update(settings, tmp_path):
    full = [_mem(1), _mem(2, topics=["t"], concepts=["c"], supersedes=["m1"], metadata={"a": 1})]
    ingest_file(write_jsonl(tmp_path / "a.jsonl", full), settings, progress=False)
    report = ingest_file(write_jsonl(tmp_path / "b.jsonl", [_mem(1), _mem(2)]), settings, progress=False)
    assert (report.inserted, report.updated, report.unchanged) == (0, 1, 1)
    with Store.open(compacted(settings), read_only=True) as store:
        assert store.con.execute("SELECT count(*) FROM edges").fetchone()[0] == 0
        assert store.con.execute("SELECT metadata FROM memories WHERE id = 'm2'").fetchone()[0] is None
