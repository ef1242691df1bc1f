"""The store's tuned fusion settings (``dimple tune --apply``), read by every
process that serves the store.

    the one row of the lake table ``tuned`` (schema/lake/005_tuned.sql), updated in
    one commit: every host sharing the lake serves the same
    {"version", "tuned_at", "settings": {"fusion", "convex_alpha" | "rrf_k"}, "evidence"}

The segment store of earlier versions kept the same document in
``data_dir/TUNED.json``; ``dimple migrate`` carries it into the lake (``carry_file``).

One read (``read_tuned``) and one write (``write_tuned``; ``None`` removes
them, ``dimple tune --reset``). Precedence: the
environment's settings < the store's tuned settings (``overlay``, unless
``use_tuned`` is off) < a query's own options. A store without any keeps the
environment's settings.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import StoreError
from pipeline.settings import Settings, mask_url
from pipeline.store.lake.catalog import LAKE, Catalog, NoLake, one
from pipeline.store.lake.commit import retrying
from pipeline.store.lake.follow import Follower
from pipeline.store.lake.store import Lake

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


def where(settings: Settings) -> str:
    """Where the store keeps its tuned settings, for messages."""
    return f"the lake at {mask_url(settings.lake_catalog)}"  # no catalog password in a message


def _parse(text: str, source: str) -> Tuned:
    try:
        return Tuned.model_validate_json(text)
    except ValidationError as exc:
        raise StoreError(f"{source} holds no tuned settings this dimple reads ({exc.errors()[0]['msg']}): "
                         "'dimple tune --reset' removes them") from None


def read_tuned(settings: Settings, follower: Follower | None = None) -> Tuned | None:
    """The store's tuned settings, or None when it has none. Settings this
    dimple cannot read are a ``StoreError`` naming where they are (never
    silently the defaults). One catalog read, through
    ``follower``'s open lake when given (a serving process's), else a lake
    opened for it (none yet: None)."""
    if follower is not None:
        with follower.lock:
            lake = follower.lake()
            return None if lake is None else _read_lake(lake, settings)
    catalog = Catalog.parse(settings.lake_catalog)
    if catalog.kind == "sqlite" and not Path(catalog.target).exists():
        return None  # no lake: nothing tuned, and nothing created by looking
    try:
        opened = Lake.open(settings)
    except NoLake:
        return None
    with opened:
        return _read_lake(opened, settings)


def read_file(data_dir: Path) -> Tuned | None:
    """The tuned settings a segment store kept in ``data_dir/TUNED.json`` (None: none)."""
    try:
        text = (Path(data_dir) / TUNED).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return _parse(text, str(Path(data_dir) / TUNED))


def carry_file(settings: Settings) -> Tuned | None:
    """The tuned settings a segment store kept in ``TUNED.json`` written into
    the lake when the lake holds none (``dimple migrate``; settings tuned on
    the lake since win). Returns them as now stored, or None when nothing was
    carried."""
    old = read_file(settings.data_dir)
    if old is None or read_tuned(settings) is not None:
        return None
    return write_tuned(settings, old.settings, old.evidence)


def _read_lake(lake: Lake, settings: Settings) -> Tuned | None:
    row = one(lake.con.execute("SELECT document FROM tuned"))
    return None if row is None or row[0] is None else _parse(row[0], where(settings))


def write_tuned(settings: Settings, chosen: TunedFusion | None, evidence: dict[str, Any] | None = None) -> Tuned | None:
    """Make ``chosen`` the store's tuned settings (version one above the
    last), or with None remove them: the lake's row is updated in one
    commit (two at once: the catalog commits one, the other starts again on
    it). A reader sees the old settings or the new, never a part."""
    try:
        lake = Lake.open(settings)
    except NoLake:
        raise StoreError(f"no store in {where(settings)} to keep tuned settings in") from None
    with lake:
        return _write_lake(lake, settings, chosen, evidence)


def _next(previous: Tuned | None, chosen: TunedFusion, evidence: dict[str, Any] | None) -> Tuned:
    return Tuned(version=(previous.version + 1) if previous else 1, tuned_at=datetime.now(UTC), settings=chosen,
                 evidence=evidence or {})


def _json(tuned: Tuned) -> str:
    return json.dumps(tuned.model_dump(mode="json"), indent=2) + "\n"


# The commit message of a change of the lake's tuned settings.
TUNED_MESSAGE = "tuned"


def _write_lake(lake: Lake, settings: Settings, chosen: TunedFusion | None,
                evidence: dict[str, Any] | None) -> Tuned | None:
    def once() -> Tuned | None:
        con = lake.con
        con.execute("BEGIN TRANSACTION")
        row = one(con.execute("SELECT document FROM tuned"))
        text = None if row is None else row[0]
        if chosen is None and text is None:
            con.execute("ROLLBACK")  # nothing to remove: no commit
            return None
        try:  # a reset removes even a row this dimple cannot read (the error's advice)
            previous = None if chosen is None or text is None else _parse(text, where(settings))
        except StoreError:
            con.execute("ROLLBACK")
            raise
        tuned = None if chosen is None else _next(previous, chosen, evidence)
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', ?)", [TUNED_MESSAGE])
        con.execute("UPDATE tuned SET document = ?", [None if tuned is None else _json(tuned)])
        con.execute("COMMIT")
        return tuned

    return retrying(lake.con, once, deadline_s=settings.write_wait_s, what="storing the tuned settings")[0]


def overlay(settings: S, tuned: Tuned | None) -> S:
    """``settings`` with the store's tuned values over the environment's
    (unchanged without tuned settings or with ``use_tuned`` off)."""
    if tuned is None or not settings.use_tuned:
        return settings
    return settings.replace(**tuned.settings.changes())
