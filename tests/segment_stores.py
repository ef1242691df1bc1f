"""Segment stores written by dimple itself, for ``dimple migrate``'s tests.

The segment store (a ``MANIFEST`` over a base and delta files, the store of
earlier versions) is no longer written by dimple; ``tests/data/segment_stores``
holds stores its last writing version wrote (``make.py`` there says how),
each a ``.tar.gz`` of a data dir with ``fixture.json`` (what was written)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).parent / "data" / "segment_stores"


def unpack(name: str, data_dir: Path) -> dict[str, Any]:
    """Store ``name`` into ``data_dir`` (made if missing; files of the same
    name replaced, others kept, as a later version of the same store would
    leave them); returns its ``fixture.json``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(FOLDER / f"{name}.tar.gz", "r:gz") as tar:
        tar.extractall(data_dir, filter="data")
    facts = json.loads((data_dir / "fixture.json").read_text(encoding="utf-8"))
    (data_dir / "fixture.json").unlink()
    return facts
