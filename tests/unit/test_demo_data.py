"""The demo corpus tables: the JSON files load, are well formed, and are what the generator uses."""

from __future__ import annotations

import ast
import random
import re
from importlib.resources import files
from pathlib import Path

import pytest

from pipeline.datasets.demo import generate_corpus, generate_queries
from pipeline.datasets.demo import tables as T
from pipeline.datasets.demo.world import World, slot_names

PACKAGE = Path(T.__file__).parent
DATA = files("pipeline.datasets") / "demo_data"

INCIDENT_SLOTS = {"code", "host", "aux", "path", "ticket", "version", "pid", "hex"}
SUPPORT_SLOTS = {"date", "booking", "hotel", "city", "rest"}


def _extra_slots(extra) -> set[str]:
    return set(extra(World(random.Random(0)))) if extra else set()


def _templates() -> list[tuple[str, str, set[str], set[str]]]:
    """(where, template, slots the builder fills, slots the template must use) for every formatted string."""
    out = []

    def add(where, templates, allowed, required=()):
        out.extend((f"{where}[{i}]", t, set(allowed), set(required)) for i, t in enumerate(templates))

    for i, c in enumerate(T.CHAINS):
        extra = _extra_slots(c.extra)
        add(f"chains[{i}].first", c.first, {"v"} | extra, {"v"})
        add(f"chains[{i}].update", c.update, {"v", "old"} | extra, {"v", "old"})
        add(f"chains[{i}].question", [c.question], extra)
    for i, c in enumerate(T.CONFLICTS):
        extra = _extra_slots(c.extra)
        add(f"conflicts[{i}].a", c.a, {"v"} | extra, {"v"})
        add(f"conflicts[{i}].b", c.b, {"v"} | extra, {"v"})
        add(f"conflicts[{i}].question", [c.question], extra)
    for i, s in enumerate(T.INCIDENTS):
        # The host is judged an identifier of the first log line, the code and ticket of the conclusion.
        add(f"incidents[{i}].logs", s.logs[:1], INCIDENT_SLOTS | {"ts"}, {"ts", "host"})
        add(f"incidents[{i}].logs", s.logs[1:], INCIDENT_SLOTS | {"ts"}, {"ts"})
        add(f"incidents[{i}].conclusion", [s.conclusion], INCIDENT_SLOTS, {"code", "ticket"})
        add(f"incidents[{i}].question", [s.question], ())  # used as it is
    add("incidents.followups", T.FOLLOWUPS, INCIDENT_SLOTS, {"ticket"})
    for i, s in enumerate(T.SUPPORTS):
        add(f"supports[{i}]", [s.evidence, s.conclusion, s.question], SUPPORT_SLOTS)
    add("code.deploy_templates", T.DEPLOY_TEMPLATES, {"service", "version", "env", "Env", "extra"}, {"version"})
    add("code.review_templates", T.REVIEW_TEMPLATES, {"pr", "path", "comment"}, {"path", "comment"})
    add("code.snippet_templates", T.SNIPPET_TEMPLATES, {"path", "snippet"}, {"path", "snippet"})
    for i, (cmd, _, _, host) in enumerate(T.COMMANDS):
        add(f"code.commands[{i}]", [cmd], {"host"} if host else (), {"host"} if host else ())
    add("code.command_templates", T.COMMAND_TEMPLATES, {"cmd"}, {"cmd"})
    add("code.decision_templates", T.DECISION_TEMPLATES, {"d"}, {"d"})
    add("code.config_templates", T.CONFIG_TEMPLATES, {"f"}, {"f"})
    add("code.dev_notes", [n for n, _, _ in T.DEV_NOTES], {"eng", "eng2", "date"})
    add("messages.people_templates", T.PEOPLE_TEMPLATES, {"p"}, {"p"})
    add("messages.preference_templates", T.PREFERENCE_TEMPLATES, {"p"}, {"p"})
    add("messages.plans", [p for p, _, _ in T.PLANS], {"date", "friend"})
    add("messages.travel", [t for t, _, _ in T.TRAVEL], {"date", "booking"}, {"booking"})
    add("messages.meeting_templates", T.MEETING_TEMPLATES, {"who", "Who", "subject", "date", "time", "place"})
    for kind, questions in T.IDENTIFIER_QUESTIONS.items():
        add(f"queries.identifier_questions.{kind}", questions, {"x"}, {"x"})
    return out


def test_the_data_directory_holds_exactly_the_json_files_the_loader_reads():
    names = sorted(entry.name for entry in DATA.iterdir())
    assert names == sorted(f"{name}.json" for name in T.FILES)
    for name in T.FILES:
        data = T.read(name)
        assert data["about"] and all(isinstance(line, str) for line in data["about"]), name
        assert len(data) > 1, f"{name}.json has no tables"


def _loads(tree: ast.AST) -> set[str]:
    """Names read in a module: ``T.NAME`` attributes and bare names in load context."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            out.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            out.add(node.id)
    return out


def test_every_table_in_the_data_is_loaded_and_read_by_the_generator():
    builders = set()
    for path in PACKAGE.glob("*.py"):
        if path.name != "tables.py":
            builders |= _loads(ast.parse(path.read_text(encoding="utf-8")))
    in_tables = _loads(ast.parse((PACKAGE / "tables.py").read_text(encoding="utf-8")))
    for name in T.FILES:
        for table, rows in T.read(name).items():
            if table == "about":
                continue
            public, private = table.upper(), f"_{table.upper()}"
            assert hasattr(T, public) or hasattr(T, private), f"{name}.json:{table} has no constant in tables.py"
            value = getattr(T, public, None) if hasattr(T, public) else getattr(T, private)
            assert len(value) == len(rows) > 0, f"{name}.json:{table}"
            if hasattr(T, public):
                assert public in builders, f"{name}.json:{table} is loaded as T.{public} but no builder reads it"
            else:
                assert private in in_tables, f"{name}.json:{table} is loaded as {private} but nothing reads it"


def test_the_loader_refuses_unread_tables_unknown_fields_and_unknown_names():
    f = T._File("x", {"about": ["a test file"], "used": [], "stray": []})
    f.take("used")
    with pytest.raises(ValueError, match="stray"):
        f.close()
    with pytest.raises(ValueError, match="typo"):
        T._rows([{"text": "a", "topics": [], "concepts": [], "typo": 1}], "x", "text", "topics", "concepts")
    with pytest.raises(ValueError, match="missing"):
        T._rows([{"text": "a"}], "x", "text", "topics", "concepts")
    chain = T.read("chains")["chains"][0]
    with pytest.raises(ValueError, match="value kind"):
        T._chain({**chain, "values": {"kind": "random_walk"}}, "x")
    with pytest.raises(ValueError, match="extra"):
        T._chain({**chain, "extra": "weather"}, "x")
    with pytest.raises(ValueError, match="names.json"):
        T._pool("interns", "x")


def test_every_template_fills_from_the_slots_its_builder_gives():
    templates = _templates()
    assert len(templates) > 200
    for where, template, allowed, required in templates:
        used = set(slot_names(template))
        assert used <= allowed, f"{where}: {template!r} uses {sorted(used - allowed)}, the builder fills {sorted(allowed)}"
        assert required <= used, f"{where}: {template!r} must use {sorted(required - used)}"
        template.format(**{slot: "x" for slot in allowed})  # no positional fields, no stray braces


def test_the_specs_registries_and_question_kinds_match():
    data = T.read("chains")["chains"]
    assert len(data) == len(T.CHAINS)
    assert {c["values"]["kind"] for c in data} == set(T.VALUE_KINDS), "a value kind nothing uses, or a missing one"
    assert {c["extra"] for c in data if "extra" in c} == set(T.EXTRAS)
    kinds = {c.ident_kind for c in T.CHAINS if c.ident_kind} | {"error", "ticket", "host", "path", "version", "booking"}
    assert kinds == set(T.IDENTIFIER_QUESTIONS)
    for c in T.CONFLICTS:
        assert len(set(c.pool)) == len(c.pool) >= 2 and len(c.grades) == len(c.types) == len(c.sources) == 2
    for c in T.CHAINS:
        assert len(c.types) == 2 and c.first and c.update
    for tagged in (T.DECISIONS, T.CONFIG_FACTS, T.DEV_NOTES, T.PEOPLE, T.PREFERENCES, T.PLANS, T.TRAVEL, T.CHATS,
                   T.HOUSEHOLD, T.REVIEWS, T.SNIPPETS):
        for row in tagged:
            topics, concepts = row[-2:]
            assert 1 <= len(topics) <= 2 and len(concepts) <= 3, row
    for spec in T.SUPPORTS:
        assert spec.window is None or spec.window[0] < spec.window[1]


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{[a-zA-Z_]+\}", template.replace("{{", "{").replace("}}", "}"))
    return re.compile(".+".join(re.escape(p) for p in parts))


def test_the_corpus_is_made_of_the_data():
    corpus = generate_corpus(7)
    queries, _ = generate_queries(corpus, 7)
    texts = [r["content"] for r in corpus]
    asked = [q["text"] for q in queries]

    def count(sentence: str) -> int:
        return sum(sentence in t for t in texts)

    for table in (T.DECISIONS, T.CONFIG_FACTS, T.PEOPLE, T.PREFERENCES, T.CHATS, T.HOUSEHOLD):
        for sentence, _, _ in table:
            assert count(sentence) == 1, sentence
    for _, comment, _, _ in T.REVIEWS:
        assert count(comment) == 1, comment
    for path, snippet, _, _ in T.SNIPPETS:
        assert count(snippet) == 1 and count(path) >= 1, snippet
    for spec in T.INCIDENTS:
        assert count(spec.code) >= 2, spec.code  # a log line and the conclusion
    # Chain and conflict questions are always asked.
    for question in [c.question for c in T.CHAINS] + [c.question for c in T.CONFLICTS]:
        assert any(_pattern(question).fullmatch(a) for a in asked), question
