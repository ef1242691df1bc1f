"""Whether a process of this host is gone, by its pid: the one check behind
a dead compaction's claim (``pipeline.store.lake.compaction``), a dead
builder's partial base (``pipeline.store.lake.derive.sweep_builds``) and a
run dir's processes (``ops.stack``)."""

from __future__ import annotations

import os
from pathlib import Path


def gone(pid: int) -> bool:
    """True when no process ``pid`` runs here: none by that pid, or a zombie
    (killed, not yet reaped by its parent). Another user's process, which
    this one may not signal, is alive. A pid used again reads as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]
