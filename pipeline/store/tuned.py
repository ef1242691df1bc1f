"""The store's tuned fusion settings (``dimple tune --apply``): one small JSON
file in the data dir, replaced atomically, read by every process that serves
the store.

    data_dir/TUNED.json   {"version", "tuned_at", "settings": {"fusion", "convex_alpha" | "rrf_k"}, "evidence"}

One read (``read_tuned``) and one write (``write_tuned``; ``None`` removes it,
``dimple tune --reset``), so a store that keeps its state elsewhere (the lake)
moves this in one place. Precedence: the environment's settings < the store's
tuned settings (``overlay``, unless ``use_tuned`` is off) < a query's own
options. A store without the file keeps the environment's settings.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import StoreError
from pipeline.settings import Settings
from pipeline.store.segments import fsync_dir, fsync_file

TUNED = "TUNED.json"
FIELDS = ("fusion", "convex_alpha", "rrf_k")  # what tuning may set, and all it may set

S = TypeVar("S", bound=Settings)


class TunedFusion(BaseModel):
    """The fusion settings ``dimple tune`` chose (only the chosen configuration's own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fusion: Literal["rrf", "convex"]
    convex_alpha: float | None = Field(None, ge=0, le=1)
    rrf_k: int | None = Field(None, ge=1, le=100_000)

    def changes(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Tuned(BaseModel):
    """The file: what was chosen, when, its version (1 for the first ``--apply``), and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1)
    tuned_at: datetime
    settings: TunedFusion
    evidence: dict[str, Any] = Field(default_factory=dict)


def path(data_dir: Path) -> Path:
    return Path(data_dir) / TUNED


def read_tuned(data_dir: Path) -> Tuned | None:
    """The store's tuned settings, or None when it has none. A file this
    dimple cannot read is a ``StoreError`` naming it (never silently the defaults)."""
    try:
        text = path(data_dir).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return Tuned.model_validate_json(text)
    except ValidationError as exc:
        raise StoreError(f"{path(data_dir)} is not tuned settings this dimple reads ({exc.errors()[0]['msg']}): "
                         "'dimple tune --reset' removes it") from None


def write_tuned(data_dir: Path, settings: TunedFusion | None, evidence: dict[str, Any] | None = None) -> Tuned | None:
    """Make ``settings`` the store's tuned settings (version one above the
    last), or with None remove them; written, fsynced and renamed over the
    file, so a reader sees the old file or the new one, never a part."""
    target = path(data_dir)
    if settings is None:
        if target.exists():
            target.unlink()
            fsync_dir(target.parent)
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    previous = read_tuned(data_dir) if target.exists() else None
    tuned = Tuned(version=(previous.version + 1) if previous else 1, tuned_at=datetime.now(UTC),
                  settings=settings, evidence=evidence or {})
    tmp = target.with_name(f"{TUNED}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(tuned.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    fsync_file(tmp)
    os.replace(tmp, target)
    fsync_dir(target.parent)
    return tuned


def overlay(settings: S, tuned: Tuned | None) -> S:
    """``settings`` with the store's tuned values over the environment's
    (unchanged without tuned settings or with ``use_tuned`` off)."""
    if tuned is None or not settings.use_tuned:
        return settings
    return settings.replace(**tuned.settings.changes())
