"""JSON Lines are separated by ``\\n`` alone: every reader keeps a record whose
strings hold U+0085, U+2028 or U+2029 whole (a public BEIR corpus has them)."""

from __future__ import annotations

import json

import pytest

from pipeline.datasets.beir import load_beir
from pipeline.errors import InputError
from pipeline.evaluation.queries import read_qrels, read_queries
from pipeline.settings import Settings
from pipeline.store.ingest import read_file
from pipeline.textfiles import lines_of, read_lines

ODD = "NEL\u0085 LS\u2028 PS\u2029 VT\x0b FF\x0c FS\x1c end"


def test_lines_end_at_newline_only():
    assert "\u0085" in ODD and len(ODD.splitlines()) > 1  # what str.splitlines would have done
    assert lines_of(f"{ODD}\nb\r\nc") == [ODD, "b", "c"]
    assert lines_of("a\n") == ["a"] and lines_of("") == [] and lines_of("\n\n") == ["", ""]


def test_every_jsonl_reader_keeps_such_a_record_whole(tmp_path, settings: Settings):
    record = {"id": "m1", "namespace": "n", "content": ODD}
    memories = tmp_path / "memories.jsonl"
    memories.write_text(json.dumps(record, ensure_ascii=False) + "\n" + json.dumps({**record, "id": "m2"}) + "\n",
                        encoding="utf-8")
    parsed = read_file(memories, settings.limits)
    assert not parsed.errors and [r.content for r in parsed.records] == [ODD, ODD]

    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"id": "q1", "query": ODD}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert [q.text for q in read_queries(queries, settings)] == [ODD]

    beir = tmp_path / "set"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "title": "t", "text": ODD}, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": ODD}, ensure_ascii=False) + "\n",
                                        encoding="utf-8")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n", encoding="utf-8")
    records, specs, qrels = load_beir(beir)
    assert records[0]["content"] == f"t {ODD}" and specs[0].text == ODD and qrels == {"q1": {"d1": 1}}
    assert read_qrels(beir / "qrels" / "test.tsv") == {"q1": {"d1": 1}}


def test_a_missing_or_binary_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_lines(tmp_path / "absent.jsonl")
    with pytest.raises(InputError, match="is a folder, not a file"):
        read_lines(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="not UTF-8"):
        read_lines(bad)


def test_a_beir_corpus_with_empty_documents_loads_without_them(tmp_path, caplog):
    beir = tmp_path / "cran"
    (beir / "qrels").mkdir(parents=True)
    docs = [{"_id": "1", "title": "flow", "text": "boundary layer"}, {"_id": "471", "title": "", "text": ""},
            {"_id": "2", "text": "shock waves"}, {"_id": "995", "title": None, "text": "  "}]
    (beir / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "boundary"}) + "\n", encoding="utf-8")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t1\t2\nq1\t471\t1\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="dimple.eval"):
        records, specs, qrels = load_beir(beir)
    assert [r["id"] for r in records] == ["1", "2"]
    assert "skipped 2 document(s) with neither title nor text: 471, 995" in caplog.text
    assert qrels == {"q1": {"1": 2, "471": 1}}  # a judged document that holds nothing is still wanted
    (beir / "corpus.jsonl").write_text(json.dumps(docs[1]) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="no document with a title or text"):
        load_beir(beir)
