"""The ``dimple`` command line: ``commands`` (the parser and the commands; ``main``
is the ``dimple`` entry point), ``eval`` (``dimple eval``), ``demo``, ``render``
(text for a person) and ``common`` (what the commands share: settings, logging,
ingest).

Nothing outside this package imports it (tests/unit/test_layout.py): the
Python API is ``workers.api``.
"""

from .commands import main

__all__ = ["main"]
