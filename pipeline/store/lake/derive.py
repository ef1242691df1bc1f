"""What the query path reads, derived from the lake (docs/LAKE.md): a **base**
for a snapshot ``B`` and the **deltas** of the snapshots after it, so that a
reader's view at the latest snapshot ``L`` is base(B) + overlay(B..L).

- ``build_base``: today's base file (memories, the topic tree, the full-text
  index), built from the lake's records at ``B`` by the code compaction builds
  a first base with (``pipeline.store.compact.fresh_base``); ``B`` is recorded
  in it (``base_snapshot``).
- ``deltas_since``: each snapshot after ``B`` as the ``Delta`` a write of
  today's store would have published: its memories tokenized and routed to
  the base's tree by the write path's own code
  (``pipeline.store.delta.delta_memories``), its forgotten ids as tombstones.
- ``open_view``: the reader's ``Snapshot`` of a base file with those deltas
  merged (``Snapshot.open`` + ``Snapshot.extend``, as ``Reader`` does for
  delta files), the state every stage reads.
- ``record`` / ``unlist``: a base listed in the lake's ``indexes`` for every
  host to load, and taken back; ``sweep_builds``: what builders that died left.

The reader reads these (``pipeline.store.lake.follow``).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
import time
from pathlib import Path

import numpy as np

from pipeline.errors import StoreError
from pipeline.processes import gone
from pipeline.settings import Settings
from pipeline.store import files
from pipeline.store.compact import fresh_base
from pipeline.store.database import Store, utcnow
from pipeline.store.delta import delta_memories
from pipeline.store.lake.catalog import LAKE, ask, one
from pipeline.store.lake.commit import index_message, retrying
from pipeline.store.lake.read import Cut
from pipeline.store.lake.records import Changes, SnapshotWrite
from pipeline.store.lake.store import Lake
from pipeline.store.overlay import Delta
from pipeline.store.reader import Snapshot
from pipeline.store.vector import TreeRouter

# The ``store_meta`` key of a base built from the lake: the snapshot it holds.
SNAPSHOT_KEY = "lake_snapshot"


def build_base(lake: Lake, snapshot: int, path: Path, settings: Settings) -> Path:
    """Write a base file at ``path`` (new; not inside the lake's data path,
    whose clean-up deletes files it does not know) holding the lake's memories
    at ``snapshot``, indexed as compaction indexes a base. Raises
    ``InputError`` naming ``as_of`` for a snapshot the lake does not hold."""
    path = Path(path)
    data_path = lake.data_path.resolve()
    if path.resolve().is_relative_to(data_path):
        raise StoreError(f"store.data_path: a base may not be written inside the lake's data path {data_path}")
    if path.exists():
        raise StoreError(f"{path} exists: a base is written once, under a new name")
    memories = lake.read(at=snapshot)
    records = [m.record() for m in memories]
    vectors = {m.id: m.embedding for m in memories}
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fresh_base(path, records, vectors, settings, embedding_model=lake.info.embedding_model,
               embedding_dim=lake.info.embedding_dim, meta={SNAPSHOT_KEY: str(snapshot)})
    return path


# A base being built: ``.<base name>.<host>.<pid>.<thread>.duckdb`` (``.work``
# while DuckDB writes it, ``fresh_base``; ``.wal`` beside it), linked into place
# when whole. A builder SIGKILLed leaves it (a base's size); ``sweep_builds``
# deletes this host's whose process is gone, and any past ``STALE_BUILD_S``
# (another host's, where the index path is shared: a build takes minutes);
# an erase, every one of a snapshot it expired, whoever builds it.
_BUILD = re.compile(r"\.base-(?P<snapshot>\d+)\.(?:(?P<host>[A-Za-z0-9-]+)\.)?(?P<pid>\d+)\.\d+\.duckdb"
                    r"(?:\.work)?(?:\.wal)?")
STALE_BUILD_S = 6 * 3600.0


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"


def build_path(target: Path) -> Path:
    """Where this thread builds the base ``target`` before linking it into place."""
    return target.with_name(f".{target.stem}.{_host()}.{os.getpid()}.{threading.get_ident()}.duckdb")


def sweep_builds(folder: Path, *, expired_before: int | None = None) -> list[str]:
    """Delete what builders that died left in the index path ``folder``
    (``build_path``'s files): this host's whose process is gone, and every
    one older than ``STALE_BUILD_S``. After an erase (``expired_before``: the
    snapshot it kept, every one before it expired) also every build of an
    earlier snapshot, any host's, any age: it may hold an erased memory, and
    it can never be listed (a live builder finds its snapshot expired:
    ``Follower.build_listed``), whereas only this host can tell which of its
    builders died. The names deleted."""
    if not folder.is_dir():
        return []
    deleted: list[str] = []
    host, now = _host(), time.time()
    for path in sorted(folder.iterdir()):
        m = _BUILD.fullmatch(path.name)
        if m is None:
            continue
        try:
            stale = now - path.stat().st_mtime > STALE_BUILD_S
        except FileNotFoundError:
            continue
        expired = expired_before is not None and int(m.group("snapshot")) < expired_before
        if stale or expired or (m.group("host") == host and gone(int(m.group("pid")))):
            path.unlink(missing_ok=True)
            deleted.append(path.name)
    return deleted


def settings_digest(settings: Settings) -> str:
    """A digest of the settings that shape a base (the tree, the full-text
    index, the embedding model), recorded beside it in ``indexes``."""
    text = "\n".join([settings.tree.model_dump_json(), settings.fulltext.model_dump_json(), settings.embedding_model])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record(lake: Lake, snapshot: int, path: Path, write_id: str | None = None) -> int:
    """List the base file ``path`` (under the index path) for ``snapshot`` in
    ``indexes`` (one transaction); the snapshot that lists it. ``write_id``:
    the write whose base it is (a replay of it answers this snapshot:
    ``commit.snapshot_of_write``). A base another builder listed first (a
    reader, a compaction) is listed again under ``write_id``, so that the
    write and its replay answer the same snapshot (``listed`` reads one file
    per snapshot however many rows name it)."""
    name = path.name

    def once() -> int:
        con = lake.con
        con.execute("BEGIN TRANSACTION")
        held = one(con.execute("SELECT count(*) FROM indexes WHERE snapshot = ? AND path = ?", [snapshot, name]))
        if held and held[0] and write_id is None:
            con.execute("ROLLBACK")
            return lake.latest_snapshot()
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', ?)", [index_message(write_id)])
        con.execute("INSERT INTO indexes VALUES (?, ?, ?, ?)", [snapshot, name, utcnow(), settings_digest(lake.settings)])
        con.execute("COMMIT")
        row = one(con.execute(f"SELECT id FROM ducklake_last_committed_snapshot('{LAKE}')"))
        return int(row[0]) if row and row[0] is not None else lake.latest_snapshot()

    what = f"recording the base of snapshot {snapshot}"
    listing = retrying(lake.con, once, deadline_s=lake.settings.write_wait_s, what=what)[0]
    # Asked after the listing committed: an erase expires the snapshots before its new
    # base and only then deletes the bases listed before it, so a base built from a
    # snapshot the erase expired meanwhile (it may hold what was erased) is either
    # seen by that deletion or, listed after it, found expired here and taken back.
    if not exists(lake, snapshot):
        _unlist(lake, snapshot, path)
        cut = expired_build(snapshot)
        cut.listing = listing  # what a replay of the write answers (``commit.snapshot_of_write``)
        raise cut
    return listing


def exists(lake: Lake, snapshot: int) -> bool:
    """Whether the catalog still holds ``snapshot`` (asked now: an erase expires snapshots)."""
    return bool(ask(lake.con, "SELECT snapshot_id FROM ducklake_snapshot WHERE snapshot_id = ?", [snapshot]))


def expired_build(snapshot: int) -> Cut:
    return Cut(f"snapshot {snapshot} expired (an erase's cut) while its base was built: the base was not kept",
               expired=True)


def _unlist(lake: Lake, snapshot: int, path: Path) -> None:
    """Take back the base ``path`` of the expired ``snapshot``: its file, then its rows."""
    files.remove_file(path)
    files.fsync_dir(path.parent)
    unlist(lake, [snapshot], f"taking back the base of snapshot {snapshot}")


def unlist(lake: Lake, snapshots: list[int], what: str) -> None:
    """Delete the ``indexes`` rows of the bases of ``snapshots`` (their files deleted first), one commit."""
    def once() -> None:
        con = lake.con
        con.execute("BEGIN TRANSACTION")
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'index')")
        con.execute("DELETE FROM indexes WHERE snapshot IN (SELECT unnest(?))", [snapshots])
        con.execute("COMMIT")

    retrying(lake.con, once, deadline_s=lake.settings.write_wait_s, what=what)


def base_snapshot(store: Store) -> int | None:
    """The lake snapshot a base holds (None: a base file not built from the lake)."""
    value = store.meta(SNAPSHOT_KEY)
    return None if value is None else int(value)


def deltas_since(changes: Changes, router: TreeRouter | None, settings: Settings, dim: int) -> dict[int, Delta]:
    """Each snapshot of ``changes`` that wrote or forgot memories, as a delta
    (by snapshot id) over the base ``router`` routes to (None: no base)."""
    return deltas_of(changes.writes(dim), router, settings, dim)


def deltas_of(writes: list[SnapshotWrite], router: TreeRouter | None, settings: Settings, dim: int) -> dict[int, Delta]:
    """``writes`` (``Changes.writes``) as deltas by snapshot id (``deltas_since``).
    Their memories are tokenized and routed in one call (``fulltext.tokenize``:
    ASCII text in Python, the rest by one full-text index built for the call,
    not one a snapshot): each memory's terms and leaf are its own."""
    every = [m for done in writes for m in done.remembered]
    vectors = (np.stack([m.embedding for m in every]).astype(np.float32) if every
               else np.zeros((0, dim), np.float32))
    prepared = delta_memories([m.record() for m in every], [m.created_at for m in every], vectors, settings, router)
    out, at = {}, 0
    for done in writes:
        n = len(done.remembered)
        out[done.snapshot] = Delta(seq=done.snapshot, memories=prepared[at:at + n], vectors=vectors[at:at + n].copy(),
                                   forget=list(done.forgotten), unlinked=list(done.unlinked))
        at += n
    return out


def open_view(lake: Lake, base: Path, settings: Settings, *, until: int | None = None,
              memory_limit: str | None = None, cache: Path | None = None) -> Snapshot:
    """The reader's state at snapshot ``until`` (the latest when None): the base
    file ``base`` (built by ``build_base``) with every later snapshot merged
    over it; ``cache``: the base's folder in the host cache (``Snapshot.open``).
    Raises ``StoreError`` when the base's snapshot has expired from the lake
    (load a newer base), or the file is gone."""
    snap = Snapshot.open(base, 0, base=str(base), memory_limit=memory_limit, cache=cache)
    try:
        assert snap.store is not None
        since = base_snapshot(snap.store)
        if since is None:
            raise StoreError(f"{base} is not a base built from the lake (no {SNAPSHOT_KEY} in its store_meta)")
        until = lake.latest_snapshot() if until is None else until
        if until < since:
            raise StoreError(f"{base} holds snapshot {since}, after the snapshot {until} asked for")
        deltas = deltas_since(lake.changes_since(since, until), snap.router(), settings, lake.info.embedding_dim)
        return snap.extend(until, deltas)
    except BaseException:
        snap.close()
        raise
