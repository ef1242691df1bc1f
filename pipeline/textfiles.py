"""Reading line-oriented files (JSON Lines, TREC and TSV judgments): one rule
for every reader in the project.

Lines end at ``\\n`` (a ``\\r\\n`` ending loses its ``\\r``) and nowhere else.
Not ``str.splitlines``: that also splits at U+2028, U+0085 and other
characters JSON allows raw inside a string, which would cut a valid record
in two (a public BEIR corpus has such lines).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.errors import InputError


def lines_of(text: str) -> list[str]:
    """``text`` split at ``\\n`` only; a final line end adds no empty line, and
    a leading byte-order mark (editors on Windows write one) is no part of the first line."""
    text = text.removeprefix("\ufeff")
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


STDIN = "-"  # a FILE argument that reads standard input


def read_lines(path: Path, what: str = "FILE") -> list[str]:
    """The lines of a UTF-8 file (``lines_of``), or of standard input for
    ``-``; a missing or unreadable file is an ``InputError`` naming ``what``."""
    path = Path(path)
    try:
        if str(path) == STDIN:
            return lines_of(sys.stdin.buffer.read().decode("utf-8"))
        if path.is_dir():
            raise InputError(what, f"{path} is a folder, not a file")
        if not path.is_file():
            raise InputError(what, f"no such file: {path}")
        return lines_of(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(what, f"{'standard input' if str(path) == STDIN else path.name}: not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    except OSError as exc:  # a name too long, no permission, ...
        raise InputError(what, f"cannot read {path}: {exc.strerror or exc}") from None
