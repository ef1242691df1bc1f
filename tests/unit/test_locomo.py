"""The LoCoMo loader, on a tiny hand-built file (and, when present, the real one)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.datasets.locomo import LocomoSet, load_locomo, parse_session_datetime, write_locomo_jsonl

REAL = Path(__file__).resolve().parents[3] / "shared/data/locomo/locomo10.json"


def _fixture() -> list[dict]:
    # Shaped like locomo10.json: sessions out of key order (session_10 before
    # session_2), a date for a session with no turns, an image turn, every kind
    # of awkward evidence the real file has.
    conv_a = {
        "speaker_a": "Ann",
        "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "Hi Bob! I adopted a dog."},
            {
                "speaker": "Bob",
                "dia_id": "D1:2",
                "text": "Look at mine!",
                "img_url": ["https://example.invalid/dog.jpg"],
                "blip_caption": "a photo of a brown dog on a beach",
                "query": "dog beach",
            },
            {"speaker": "Ann", "dia_id": "D1:3", "text": "So cute. I start pottery class tomorrow."},
        ],
        "session_10_date_time": "12:00 pm on 1 January, 2024",
        "session_10": [
            {"speaker": "Bob", "dia_id": "D10:1", "text": "Happy new year!"},
        ],
        "session_2_date_time": "12:05 am on 20 May, 2023",
        "session_2": [
            {"speaker": "Bob", "dia_id": "D2:1", "text": "How was pottery?"},
            {"speaker": "Ann", "dia_id": "D2:2", "text": "I made a bowl."},
        ],
        "session_3_date_time": "3:00 pm on 1 June, 2023",
    }
    qa_a = [
        {"question": "What class did Ann start?", "answer": "pottery", "evidence": ["D1:3"], "category": 2},
        {"question": "What did Bob's cat eat?", "adversarial_answer": "fish", "evidence": ["D1:2"], "category": 5},
        {"question": "What did Ann make and own?", "answer": "a bowl, a dog", "evidence": ["D1:1; D2:2"], "category": 1},
        {"question": "What pet does Ann have?", "answer": "a dog", "evidence": ["D1:1", "D9:9"], "category": 4},
        {"question": "Why is Ann happy?", "answer": "dog", "evidence": [], "category": 3},
        {"question": "What did Ann bake?", "answer": "bread", "evidence": ["D7:7"], "category": 1},
        {"question": "When did Bob greet?", "answer": 2024, "evidence": ["D:2:1", "D10:01"], "category": 2},
        {"question": "What did they talk about?", "answer": "pets", "evidence": ["D1:1 D2:1"], "category": 3},
    ]
    conv_b = {
        "speaker_a": "Cy",
        "speaker_b": "Di",
        "session_1_date_time": "9:00 am on 15 June, 2023",
        "session_1": [
            {"speaker": "Cy", "dia_id": "D1:1", "text": "Morning!"},
            {"speaker": "Di", "dia_id": "D1:2", "text": "I'm moving to Oslo."},
        ],
    }
    qa_b = [{"question": "Where is Di moving?", "answer": "Oslo", "evidence": ["D1:2"], "category": 1}]
    return [
        {"sample_id": "conv-a", "conversation": conv_a, "qa": qa_a, "event_summary": {}, "observation": {}},
        {"sample_id": "conv-b", "conversation": conv_b, "qa": qa_b},
    ]


def _record(ns: str, dia: str, session: int, content: str, at: str, image: bool = False, context=None) -> dict:
    metadata = {"session": session, "speaker": content.split(":")[0], "dia_id": dia}
    if image:
        metadata["image"] = True
    return {
        "id": f"{ns}:{dia}",
        "namespace": ns,
        "content": content,
        "content_type": "chat",
        "created_at": at,
        "topics": [f"session-{session}"],
        "concepts": [],
        "supersedes": [],
        "conflicts": [],
        "supported_by": [],
        "metadata": metadata,
        "context": context,  # the previous turn of the same session
    }


EXPECTED_RECORDS = [
    _record("conv-a", "D1:1", 1, "Ann: Hi Bob! I adopted a dog.", "2023-05-08T13:56:00Z"),
    _record(
        "conv-a", "D1:2", 1, "Bob: Look at mine! [shares an image: a photo of a brown dog on a beach]",
        "2023-05-08T13:56:01Z", image=True, context="Ann: Hi Bob! I adopted a dog.",
    ),
    _record("conv-a", "D1:3", 1, "Ann: So cute. I start pottery class tomorrow.", "2023-05-08T13:56:02Z",
            context="Bob: Look at mine! [shares an image: a photo of a brown dog on a beach]"),
    _record("conv-a", "D2:1", 2, "Bob: How was pottery?", "2023-05-20T00:05:00Z"),
    _record("conv-a", "D2:2", 2, "Ann: I made a bowl.", "2023-05-20T00:05:01Z", context="Bob: How was pottery?"),
    _record("conv-a", "D10:1", 10, "Bob: Happy new year!", "2024-01-01T12:00:00Z"),
    _record("conv-b", "D1:1", 1, "Cy: Morning!", "2023-06-15T09:00:00Z"),
    _record("conv-b", "D1:2", 1, "Di: I'm moving to Oslo.", "2023-06-15T09:00:01Z", context="Cy: Morning!"),
]

EXPECTED_QUERIES = [
    {"id": "conv-a:q0", "text": "What class did Ann start?", "namespace": "conv-a", "category": 2},
    {"id": "conv-a:q2", "text": "What did Ann make and own?", "namespace": "conv-a", "category": 1},
    {"id": "conv-a:q3", "text": "What pet does Ann have?", "namespace": "conv-a", "category": 4},
    {"id": "conv-a:q6", "text": "When did Bob greet?", "namespace": "conv-a", "category": 2},
    {"id": "conv-a:q7", "text": "What did they talk about?", "namespace": "conv-a", "category": 3},
    {"id": "conv-b:q0", "text": "Where is Di moving?", "namespace": "conv-b", "category": 1},
]

EXPECTED_QRELS = {
    "conv-a:q0": {"conv-a:D1:3": 1},
    "conv-a:q2": {"conv-a:D1:1": 1, "conv-a:D2:2": 1},
    "conv-a:q3": {"conv-a:D1:1": 1},
    "conv-a:q6": {"conv-a:D2:1": 1, "conv-a:D10:1": 1},
    "conv-a:q7": {"conv-a:D1:1": 1, "conv-a:D2:1": 1},
    "conv-b:q0": {"conv-b:D1:2": 1},
}


@pytest.fixture()
def fixture_path(tmp_path: Path) -> Path:
    path = tmp_path / "locomo_tiny.json"
    path.write_text(json.dumps(_fixture()), encoding="utf-8")
    return path


def test_loader_output_is_exact(fixture_path: Path) -> None:
    got = load_locomo(fixture_path)
    assert isinstance(got, LocomoSet)
    assert got.records == EXPECTED_RECORDS
    assert got.queries == EXPECTED_QUERIES
    assert got.qrels == EXPECTED_QRELS
    assert got.skipped == {"adversarial": 1, "no_evidence": 1, "unknown_evidence_only": 1, "unknown_evidence_ids": 2}
    assert got.repaired_evidence_ids == 2


def test_loader_is_deterministic(fixture_path: Path) -> None:
    assert load_locomo(fixture_path) == load_locomo(fixture_path)


def test_records_pass_the_ingest_model(fixture_path: Path) -> None:
    from pipeline.store import ingest
    for record in load_locomo(fixture_path).records:
        ingest.MemoryRecord.model_validate(record)


def test_write_jsonl(fixture_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "locomo.jsonl"
    assert write_locomo_jsonl(fixture_path, out) == len(EXPECTED_RECORDS)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == EXPECTED_RECORDS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)),
        ("12:00 am on 1 January, 2024", datetime(2024, 1, 1, 0, 0, tzinfo=UTC)),
        ("12:30 pm on 31 December, 2023", datetime(2023, 12, 31, 12, 30, tzinfo=UTC)),
        ("10:04 AM on 19 June 2023", datetime(2023, 6, 19, 10, 4, tzinfo=UTC)),
    ],
)
def test_session_datetime(text: str, expected: datetime) -> None:
    assert parse_session_datetime(text) == expected


@pytest.mark.parametrize("text", ["", "13:00 pm on 8 May, 2023", "1:56 pm on 8 Mayo, 2023", "2023-05-08T13:56:00Z"])
def test_session_datetime_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_session_datetime(text)


def test_duplicate_turn_ids_are_an_error(tmp_path: Path) -> None:
    data = _fixture()
    data[0]["conversation"]["session_2"][0]["dia_id"] = "D1:1"
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate"):
        load_locomo(path)


