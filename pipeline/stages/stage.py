"""What a stage is: its task name and ``run(batch, resources)``, one
signature for every stage (``search.fuse`` takes the list of the legs'
batches: ``fan_in``), and what a process lends it (``Resources``).

Each stage module declares its ``STAGE``; ``pipeline.stages.registry`` lists
them. Each stage takes a ``Batch`` and the process's ``Resources`` and returns
a ``Batch``; timing is recorded by each stage in ``QueryState.timings``
(``pipeline.timing.ms_since``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.contracts import Batch
from pipeline.embedders import Embedder
from pipeline.settings import Settings
from pipeline.store.reader import View


class Resources(Protocol):
    """What a process lends its stages; each is loaded on first use."""

    def settings(self) -> Settings: ...

    def embedder(self) -> Embedder: ...

    def view(self) -> AbstractContextManager[View | None]:
        """The published store for one stage (``pipeline.store.reader.View``: a
        cursor on the base for this thread, the deltas over it, its indexes),
        or None when nothing was written yet; closed on exit."""
        ...


@dataclass(frozen=True)
class Stage:
    """One box of the seed's pipeline: ``name`` is the task name (``search.fuse``)."""

    name: str
    run: Callable[[Any, Resources], Batch]
    fan_in: bool = False  # takes the list of the chord's leg batches (one leg's alone: a list of one)
