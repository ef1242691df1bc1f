"""The generated probe sets (``pipeline.datasets.probes``): the same seed gives
the same sets, every judgment names a memory of its set, each set has the
character it is named for, and a written BEIR folder reads back through
``load_beir`` as ``dimple eval --beir`` reads it."""

from __future__ import annotations

import re

import pytest

from pipeline.datasets import probes
from pipeline.datasets.beir import load_beir


@pytest.mark.parametrize("name", sorted(probes.SETS))
def test_same_seed_same_set_and_judgments_name_its_memories(name):
    a, b = probes.SETS[name](16), probes.SETS[name](16)
    assert (a.records, a.queries, a.qrels) == (b.records, b.queries, b.qrels)
    assert probes.SETS[name](17).records != a.records or probes.SETS[name](17).queries != a.queries
    ids = {r["id"] for r in a.records}
    assert len(ids) == len(a.records) and 50 <= len(a.records) <= 600  # embeds in about a minute on two cores
    assert len(a.queries) >= 50 and set(a.qrels) == {q["id"] for q in a.queries}
    for rels in a.qrels.values():
        assert rels and set(rels) <= ids and max(rels.values()) >= 1


def _words(text):
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def test_identifier_questions_quote_an_identifier_held_by_their_memories_only():
    s = probes.identifiers()
    content = {r["id"]: r["content"] for r in s.records}
    for q in s.queries:
        (ident,) = [w for w in q["text"].split() if re.search(r"\d", w)]
        holders = {m for m, text in content.items() if ident in text}
        assert holders == set(s.qrels[q["id"]])


def test_paraphrase_questions_share_few_words_with_their_memory():
    s = probes.paraphrase()
    content = {r["id"]: r["content"] for r in s.records}
    stop = {"the", "a", "i", "my", "we", "is", "to", "of", "for", "in", "at", "by", "it", "does", "did", "what"}
    for q in s.queries:
        (mid,) = s.qrels[q["id"]]
        shared = (_words(q["text"]) & _words(content[mid])) - stop
        assert len(shared) <= 2, (q["text"], content[mid])


def test_long_short_has_long_and_short_answers():
    s = probes.long_short()
    length = {r["id"]: len(r["content"]) for r in s.records}
    answers = [next(iter(s.qrels[q["id"]])) for q in s.queries]
    assert any(length[m] > 600 for m in answers) and any(length[m] < 120 for m in answers)


def test_beir_folder_reads_back(tmp_path):
    s = probes.entities()
    folder = probes.write_beir(s, tmp_path)
    records, queries, qrels = load_beir(folder)
    assert [r["id"] for r in records] == [r["id"] for r in s.records]
    assert [r["content"] for r in records] == [r["content"] for r in s.records]
    assert [(q.id, q.text) for q in queries] == [(q["id"], q["text"]) for q in s.queries]
    assert qrels == s.qrels


def _one_edit(clean: str, typo: str) -> bool:
    """``typo`` is ``clean`` with one letter dropped or two neighbours swapped."""
    if len(typo) == len(clean) - 1:
        return any(clean[:i] + clean[i + 1:] == typo for i in range(len(clean)))
    return len(typo) == len(clean) and any(
        clean[:i] + clean[i + 1] + clean[i] + clean[i + 2:] == typo for i in range(len(clean) - 1))


def test_typo_questions_misspell_one_or_two_words_and_keep_the_name():
    s = probes.typos()
    content = {r["id"]: r["content"] for r in s.records}
    for q in s.queries:
        (mid,) = s.qrels[q["id"]]
        memory = content[mid]
        person = " ".join(memory.split()[:2])
        (clean,) = [question.format(p=person) for fact, question in probes.TYPO_FACTS
                    if fact.format(p=person) == memory]
        pairs = list(zip(clean.split(), q["text"].split(), strict=True))
        changed = [(c, t) for c, t in pairs if c != t]
        assert 1 <= len(changed) <= 2 and all(_one_edit(c, t) for c, t in changed), (clean, q["text"])
        assert person in q["text"]


def test_howto_memories_are_told_apart_by_team_and_half_the_questions_avoid_the_tool_names():
    s = probes.howto()
    content = {r["id"]: r["content"] for r in s.records}
    plain = 0
    for q in s.queries:
        (mid,) = s.qrels[q["id"]]
        team = q["text"].split()[0].rstrip(":")
        assert content[mid].startswith(f"[{team}] ")
        plain += q["text"].startswith(f"{team}: ")
    assert 0.4 <= plain / len(s.queries) <= 0.8
    assert set(probes.HELD_OUT) <= set(probes.SETS)


def test_projects_judge_the_update_that_holds_the_asked_fact():
    s = probes.projects()
    content = {r["id"]: r["content"] for r in s.records}
    assert len(s.queries) == len(probes.CODENAMES) * len(probes.PROJECT_FACTS)
    own = 0
    for q in s.queries:
        (mid,) = s.qrels[q["id"]]
        (codename,) = [c for c in probes.CODENAMES if c in q["text"]]
        fact = next(f for f, (_, other, mine, _) in probes.PROJECT_FACTS.items()
                    if q["text"] in (other.format(c=codename), mine.format(c=codename)))
        sentence = probes.PROJECT_FACTS[fact][0]
        # the judged memory is this project's and carries the fact's sentence
        assert codename in content[mid] and sentence.split("{v}")[0].format(c=codename) in content[mid]
        own += q["text"] == probes.PROJECT_FACTS[fact][2].format(c=codename)
    assert 0.3 <= own / len(s.queries) <= 0.7  # about half (71 of 108 at the default seed)
    # one long weekly update per project, two facts in it; the others alone
    longs = [c for c in content.values() if c.startswith("Weekly update on ")]
    assert len(longs) == len(probes.CODENAMES)
