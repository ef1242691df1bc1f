"""A base: the derived indexes of one snapshot of the lake (the memories with
their topic tree, full-text index and graph) in one DuckDB file, built whole
by ``fresh_base`` for compaction and ``dimple reembed``
(``pipeline.store.lake.derive``); and ``CompactReport``, what a compaction did.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.settings import Settings
from pipeline.store import files
from pipeline.store.database import Store
from pipeline.store.fulltext import index_exists, rebuild_index
from pipeline.store.ingest import MemoryRecord, ingest_records, rebuild_tree


@dataclass
class CompactReport:
    version: int = 0
    base: str | None = None
    memories: int = 0  # memories the new base holds
    forgotten: int = 0  # forgotten memories erased from every data file and the catalog
    removed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ran: bool = True  # False: another compaction was running, or there was nothing to do
    # UTC, ISO 8601: files a compaction or a write that died left may hold forgotten bytes; the
    # forgets stay listed, erased by the first compaction from then (erase.cut)
    erase_held_until: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "base": self.base, "memories": self.memories, "forgotten": self.forgotten,
                "removed": self.removed, "seconds": round(self.seconds, 3), "ran": self.ran,
                "erase_held_until": self.erase_held_until}


def fresh_base(target: Path, records: list[MemoryRecord], vectors: dict[str, np.ndarray], settings: Settings, *,
               embedding_model: str, embedding_dim: int | None, rebuild: bool = False,
               meta: dict[str, str] | None = None) -> None:
    """A new base file at ``target`` holding ``records`` (embeddings in
    ``vectors``, by id), indexed as every base is (the topic tree, the
    full-text index), with ``meta`` added to its ``store_meta``; fsynced.
    Built under ``target``.work and renamed: a reader never sees it half written."""
    with _building(target) as work:
        with Store.open(work, read_only=False, embedding_model=embedding_model, embedding_dim=embedding_dim) as store:
            ingest_records(store, records, None, settings, vectors_of=vectors)  # type: ignore[arg-type]
            if not index_exists(store.con):  # a base of no memories too: the writes over it are searched
                rebuild_index(store.con, settings.fulltext)
            if rebuild:  # re-clusters every namespace
                rebuild_tree(store, settings)
            for key, value in (meta or {}).items():
                store.set_meta(key, value)
            store.con.execute("CHECKPOINT")
        work.rename(target)


@contextmanager
def _building(target: Path) -> Iterator[Path]:
    """The work path a new base file is built at before it becomes ``target``;
    ``target`` is fsynced (with its folder) when the block ends, and on any
    failure neither file is left."""
    work = target.with_name(target.name + ".work")
    try:
        yield work
        files.fsync_file(target)
        files.fsync_dir(target.parent)
    except BaseException:
        for path in (target, work):
            files.remove_file(path)
        raise
