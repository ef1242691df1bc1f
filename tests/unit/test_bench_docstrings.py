"""The docstring corpus of the vector benchmark (``ops/bench/docstrings.py``):
which sentences count, their packages, and held-out queries never stored."""

from __future__ import annotations

import pytest

from ops.bench import docstrings

LONG = "This function returns the number of rows that the table holds right now."


def _package(root, name: str, body: str) -> None:
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(body)


def test_sentences_of_docstring_paragraphs_with_their_package(tmp_path):
    _package(tmp_path, "alpha", f'''"""{LONG} Too short here.

>>> doctest_line_is_skipped()  # {LONG}

Returns
-------
int : the count of rows in the table that this function reads.
"""

def f():
    """It reads the table and counts every row that the caller can see. {LONG}"""
''')
    _package(tmp_path, "beta", f'"""{LONG}"""\nclass C:\n    """A class docstring with ten words in one sentence here."""\n')
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text('"""A test module docstring sentence that is long enough to count."""')
    got = docstrings.sentences(tmp_path)
    assert got == [
        ("alpha", LONG),
        ("alpha", "It reads the table and counts every row that the caller can see."),
        ("beta", "A class docstring with ten words in one sentence here."),
    ]  # short ones, doctests, numpydoc sections, tests and the repeat of LONG in beta are left out


def test_the_corpus_is_seeded_and_its_queries_are_never_stored(tmp_path):
    for p in range(3):
        body = "\n".join(f'def f{i}():\n    """Package {p} sentence {i} has enough words to be kept here."""'
                         for i in range(40))
        _package(tmp_path, f"pkg{p}", body)
    c = docstrings.corpus(50, 10, namespaces=2, root=tmp_path)
    assert len(c.texts) == len(c.namespaces) == 50 and len(c.queries) == 10
    assert not set(c.texts) & set(c.queries)
    assert set(c.namespaces) == {"pkg0", "pkg1"}  # the two largest (ties: first seen)
    assert docstrings.corpus(50, 10, namespaces=2, root=tmp_path) == c
    with pytest.raises(SystemExit, match="80 sentences"):
        docstrings.corpus(75, 10, namespaces=2, root=tmp_path)
