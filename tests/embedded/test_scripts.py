"""Full text in every script (issue 31): a keyword query in Cyrillic, Greek,
Arabic, Japanese, Chinese or Korean finds the memories holding its words,
through ``workers.api.search``, in the base, in a delta over it, and after a
compaction merged them; a snowball stemmer per store where the language has
one. How text becomes terms: ``pipeline.store.fulltext.terms.analyze``."""

from __future__ import annotations

import pytest

from tests.conftest import write_jsonl
from tests.stores import compacted
from workers.cli.common import ingest_file

# script: (query, a base memory holding its word, a delta memory holding it too, a delta memory without it)
SCRIPTS = {
    "cyrillic": ("Москве", "Встреча в Москве перенесена на пятницу.", "В Москве идёт снег.",
                 "Отчёт о продажах готов."),
    "greek": ("Αθήνα", "Η συνάντηση στην Αθήνα μετατέθηκε για την Παρασκευή.", "Βρέχει στην Αθήνα.",
              "Η αναφορά πωλήσεων είναι έτοιμη."),
    "arabic": ("القاهرة", "تم نقل الاجتماع في القاهرة إلى يوم الجمعة.", "الجو حار في القاهرة اليوم.",
               "تقرير المبيعات جاهز."),
    "japanese": ("会議", "東京の会議は金曜日に移動しました。", "明日の会議の資料を送ります。", "売上報告書が完成しました。"),
    "chinese": ("会议", "北京的会议改到星期五了。", "明天的会议取消了。", "销售报告已经完成。"),
    "korean": ("회의", "서울 회의는 금요일로 옮겨졌습니다.", "내일 회의 자료를 보냅니다.", "매출 보고서가 완성되었습니다."),
}


def _records(column: int) -> list[dict]:
    return [{"id": f"{script}-{column}", "namespace": "n", "content": texts[column]}
            for script, texts in SCRIPTS.items()]


def _found(query: str) -> set[str]:
    from workers.api import search  # the embedded pipeline, configured by the ``embedded`` fixture

    return {r.id for r in search(query, mode="keyword", max_units=20).results}


def test_a_keyword_query_in_every_script_finds_its_memories(settings, tmp_path, embedded):
    from workers import resources

    base = [*_records(1), {"id": "latin", "namespace": "n", "content": "Meeting in München at the café"}]
    ingest_file(write_jsonl(tmp_path / "base.jsonl", base), settings, progress=False)  # a store's first write: its base
    for script, (query, *_) in SCRIPTS.items():
        assert _found(query) == {f"{script}-1"}, script
    resources.current().close_store()
    ingest_file(write_jsonl(tmp_path / "delta.jsonl", _records(2) + _records(3)), settings, progress=False)
    for script, (query, *_) in SCRIPTS.items():  # base and delta scored as one corpus
        assert _found(query) == {f"{script}-1", f"{script}-2"}, script
    assert _found("金曜日") == {"japanese-1"} and _found("星期五") == {"chinese-1"}  # 会議 is not 会议
    assert _found("報告書") == {"japanese-3"} and _found("продажах") == {"cyrillic-3"}
    resources.current().close_store()
    compacted(settings)
    for script, (query, *_) in SCRIPTS.items():
        assert _found(query) == {f"{script}-1", f"{script}-2"}, script
    assert _found("Munchen cafe") == _found("MÜNCHEN") == {"latin"}
    assert _found("αθηνα") == {"greek-1", "greek-2"}  # Greek accents fold as Latin ones do
    assert _found("ΑΘΗΝΑ") == {"greek-1", "greek-2"}


def test_a_one_character_word_finds_the_memories_whose_runs_hold_it(settings, tmp_path, embedded):
    """Chinese and Japanese write many words in one character (猫 cat, 书
    book, 車 car), inside runs with no spaces: a memory's run is indexed as
    its characters and its bigrams, so such a word finds it, in the base, in
    a delta and after a compaction; a query of two or more characters still
    finds only the memories holding them side by side."""
    from workers import resources

    cat, book = "我家的猫很可爱。", "他在看一本书。"
    ingest_file(write_jsonl(tmp_path / "base.jsonl", [{"id": "cat", "namespace": "n", "content": cat},
                                                       {"id": "book", "namespace": "n", "content": book}]),
                settings, progress=False)
    assert _found("猫") == {"cat"} and _found("书") == {"book"}
    resources.current().close_store()
    ingest_file(write_jsonl(tmp_path / "delta.jsonl", [{"id": "car", "namespace": "n", "content": "新しい車を買った。"},
                                                        {"id": "cat-2", "namespace": "n", "content": "猫が好きです。"}]),
                settings, progress=False)
    assert _found("猫") == {"cat", "cat-2"} and _found("車") == {"car"}
    assert _found("猫很") == {"cat"}  # two characters: the bigram, not each character
    resources.current().close_store()
    compacted(settings)
    assert _found("猫") == {"cat", "cat-2"} and _found("书") == {"book"} and _found("車") == {"car"}


def test_a_letter_written_two_ways_finds_both(settings, tmp_path, embedded):
    """Japanese text writes Latin letters and digits full-width (ＺＯＯＭ,
    ３０１) and kana half-width (ｶﾞｽ) as often as not: each finds, and is
    found by, its usual form (NFKC). Greek ends a word with ς, which upper
    case writes Σ and lower() makes σ: a query in capitals finds it. In a
    delta and after a compaction."""
    recs = [{"id": "full", "namespace": "n", "content": "会議はＺＯＯＭで、部屋は３０１です。"},
            {"id": "half", "namespace": "n", "content": "ｶﾞｽの点検は明日です。"},
            {"id": "plain", "namespace": "n", "content": "The standup moved to Zoom."},
            {"id": "greek", "namespace": "n", "content": "Ο δρόμος είναι κλειστός."}]
    ingest_file(write_jsonl(tmp_path / "w.jsonl", recs), settings, progress=False)

    def check() -> None:
        assert _found("zoom") == _found("ＺＯＯＭ") == {"full", "plain"}
        assert _found("301") == {"full"} and _found("ガス") == _found("ｶﾞｽ") == {"half"}
        assert _found("ΚΛΕΙΣΤΟΣ") == _found("κλειστός") == _found("κλειστοσ") == {"greek"}

    check()
    compacted(settings)
    check()


@pytest.mark.parametrize("stemmer,query,holds", [
    ("russian", "Москва", "Встреча в Москве перенесена на пятницу."),
    ("russian", "новая", "Это новый план."),  # й is a letter, not и with an accent: the stemmer sees "новый"
    ("greek", "Αθήνας", "Η συνάντηση στην Αθήνα μετατέθηκε."),
    ("arabic", "بالقاهرة", "تم نقل الاجتماع في القاهرة."),
])
def test_a_stores_stemmer_matches_other_forms_of_a_word(settings, tmp_path, stemmer, query, holds):
    import workers
    from workers import resources

    settings = settings.replace(fulltext={"stemmer": stemmer})
    workers.configure(settings)
    try:
        recs = [{"id": "hit", "namespace": "n", "content": holds},
                {"id": "other", "namespace": "n", "content": "Meeting moved to Friday."}]
        ingest_file(write_jsonl(tmp_path / "s.jsonl", recs), settings, progress=False)
        assert _found(query) == {"hit"}
    finally:
        resources.current().close_store()

