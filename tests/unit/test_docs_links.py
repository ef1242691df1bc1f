"""Every relative link of the documentation points at a file that exists, and
an anchor at a heading of that file (issue 29: README.md, BENCHMARKS.md and
docs/ were split into pages that link to each other)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").rglob("*.md")])
# Written by another branch of issue 29 (generated from the settings models);
# a link to it is checked like any other once it exists.
PENDING = {ROOT / "docs" / "SETTINGS.md"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def links(text: str) -> list[str]:
    """Targets of the inline links outside fenced and indented code blocks
    and outside code spans."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or line.startswith(("    ", "\t")):
            continue
        out += LINK.findall(re.sub(r"`[^`]*`", "", line))
    return out


def anchors(text: str) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation
    dropped, spaces as hyphens, a repeated one numbered."""
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6} (.+)", line)
        if fenced or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
    return {slug if n == 0 else f"{slug}-{i}" for slug, n in seen.items() for i in range(n + 1)}


def broken(page: Path, text: str) -> list[str]:
    out = []
    for target in links(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        if not path:  # an anchor of this page
            if anchor not in anchors(text):
                out.append(f"{target}: no heading with that anchor")
            continue
        file = (page.parent / path).resolve()
        if file in PENDING and not file.exists():
            continue
        if not file.exists():
            out.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            out.append(f"{target}: no heading with that anchor")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken(page, page.read_text(encoding="utf-8")) == []


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# A page\n## Its part (one)\n", encoding="utf-8")
    page = tmp_path / "page.md"
    text = ("[ok](there.md) [ok](there.md#its-part-one) [ok](#here) ![img](there.md)\n# Here\n"
            "[gone](missing.md) [gone](there.md#nowhere) `[code](missing.md)`\n"
            "```\n[fenced](missing.md)\n```\n    [indented](missing.md)\n[web](https://example.com/x)\n")
    assert broken(page, text) == ["missing.md: no such file", "there.md#nowhere: no heading with that anchor"]


def test_the_readme_sends_no_one_to_the_project_machines_shared_folder():
    """Users do not have ``../shared``: the README names public sources."""
    assert "../shared" not in (ROOT / "README.md").read_text(encoding="utf-8")
