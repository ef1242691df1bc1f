"""A real-text corpus without a download: sentences from the docstrings of
the installed Python packages (torch, sympy, scipy, transformers, sklearn,
pandas, ...), for the benchmarks that need real embeddings at a size LoCoMo
(5,882 turns) does not have.

A sentence is one of a docstring paragraph's sentences with 8-60 words,
mostly letters, outside doctest, field-list and section-underline
paragraphs; duplicates are dropped. The namespace of a sentence is its
top-level package, and only the ``namespaces`` packages with the most
sentences are used. The same installed packages and arguments give the same
corpus; ``held_out`` sentences, drawn from the same packages and never
stored, are the queries (a question-like text of the same style as the
memories, not a copy of one).

    python -m ops.bench.vector --store /tmp/scale/docs100k --docstrings 100000 --queries 500
"""

from __future__ import annotations

import ast
import random
import re
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_PARAGRAPH = re.compile(r"\n\s*\n")
_SKIP = (">>>", "::", ":param", ":return", "---", "===")


@dataclass
class Corpus:
    texts: list[str]
    namespaces: list[str]  # one per text: its package
    queries: list[str]  # held-out sentences of the same packages


def sentences(root: Path | None = None) -> list[tuple[str, str]]:
    """(package, sentence) for every docstring sentence under ``root`` (the
    interpreter's site-packages by default), in file order, without duplicates."""
    root = root or Path(sysconfig.get_paths()["purelib"])
    seen: set[str] = set()
    out: list[tuple[str, str]] = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if len(parts) < 2 or {"tests", "test", "testing"} & set(parts):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            for para in _PARAGRAPH.split(doc or ""):
                if any(mark in para for mark in _SKIP):
                    continue
                for s in _SENTENCE_END.split(" ".join(para.split())):
                    if not 8 <= len(s.split()) <= 60 or s in seen:
                        continue
                    if sum(c.isalpha() or c == " " for c in s) < 0.85 * len(s):
                        continue
                    seen.add(s)
                    out.append((parts[0], s))
    return out


def corpus(n: int, held_out: int, *, namespaces: int = 10, seed: int = 0, root: Path | None = None) -> Corpus:
    """``n`` stored sentences and ``held_out`` query sentences, drawn at random
    from the ``namespaces`` largest packages."""
    pairs = sentences(root)
    biggest = {p for p, _ in Counter(p for p, _ in pairs).most_common(namespaces)}
    pool = [pair for pair in pairs if pair[0] in biggest]
    if len(pool) < n + held_out:
        raise SystemExit(f"the installed packages hold {len(pool)} sentences in their {namespaces} largest; "
                         f"{n} + {held_out} asked")
    chosen = random.Random(seed).sample(pool, n + held_out)
    stored, asked = chosen[:n], chosen[n:]
    return Corpus(texts=[s for _, s in stored], namespaces=[p for p, _ in stored], queries=[s for _, s in asked])
