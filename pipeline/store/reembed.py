"""``dimple reembed``: every live memory embedded again by the configured model, into a new base.

A store holds one model's vectors (``pipeline.embedders.check_model``); this
is how it moves to another. The new base records the new model and dimension,
its topic tree is clustered afresh (a reader goes on answering from the old
base until the new one is loaded).

Writes do not wait: the new vectors are committed in batches to the table ``reembedded``
(``schema/lake/006_reembed.sql``; a batch's write id is a digest of the model
and its ids and content hashes, so a run that stopped resumes from what is
there), then one commit, serialised with every write (it updates
``write_head``), checks that every live memory has its new vector (a memory
written or replaced meanwhile is embedded in another round), puts them in
place, records the model and dimension in ``lake_meta`` and empties the
table. A write prepared with the old model and committed after it is refused
(``commit._still_valid``). Then a base is built at that snapshot and listed.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipeline.embedders import Embedder, make_embedder
from pipeline.errors import InputError, StoreError
from pipeline.settings import Settings, mask_url
from pipeline.store import segments
from pipeline.store.database import utcnow
from pipeline.store.ingest import _embed_batched
from pipeline.store.lake.catalog import LAKE, NoLake, one
from pipeline.store.lake.commit import REEMBED_MESSAGE, retrying
from pipeline.store.lake.follow import Follower
from pipeline.store.lake.migrate import BATCH_SIZE  # memories per commit: the same as a migrate's
from pipeline.store.lake.records import vector_bytes
from pipeline.store.lake.store import Lake


@dataclass
class ReembedReport:
    version: int
    memories: int
    model: str
    dim: int
    previous: tuple[str, int]  # the model and dimension the store held before
    seconds: dict[str, float] = field(default_factory=dict)
    batches: int = 0  # batches of new vectors committed by this run
    resumed: int = 0  # memories whose new vectors an earlier, stopped run had committed


def reembed(settings: Settings, *, embedder: Embedder | None = None, progress: bool = False,
            batch_size: int | None = None, on_batch: Callable[[int, int], None] | None = None) -> ReembedReport:
    """Embed every live memory of the lake with ``embedder`` (default: the
    configured model's bulk embedder), then build and list a base at that
    snapshot (``_reembed_lake``)."""
    return _reembed_lake(settings, embedder=embedder, progress=progress,
                         batch_size=BATCH_SIZE if batch_size is None else batch_size, on_batch=on_batch)


# Rounds of "embed what is missing, then try to put all in place": each round
# embeds only the memories written or replaced during the one before.
ROUNDS = 10


def _reembed_lake(settings: Settings, *, embedder: Embedder | None, progress: bool, batch_size: int = BATCH_SIZE,
                  on_batch: Callable[[int, int], None] | None = None) -> ReembedReport:
    """``reembed`` (the module's docstring). ``on_batch(batch, memories)``
    is told of each batch committed (a test stops the run there)."""
    t0 = time.perf_counter()
    if batch_size < 1:
        raise InputError("batch_size", f"at least 1 memory per commit, not {batch_size}")
    segments.refuse_unmigrated(settings.data_dir)
    embedder = embedder or make_embedder(settings, bulk=True)
    model = embedder.name
    try:
        lake = Lake.open(settings)
    except NoLake:
        raise StoreError(f"no store in the lake at {mask_url(settings.lake_catalog)} to re-embed") from None
    report = ReembedReport(version=0, memories=0, model=model, dim=embedder.dim,
                           previous=(lake.info.embedding_model, lake.info.embedding_dim))
    embed_s = 0.0
    try:
        _drop_other_models(lake, model)
        report.resumed = _one(lake, "SELECT count(*) FROM reembedded WHERE model = ?", [model])
        for _ in range(ROUNDS):
            todo = lake.con.execute(
                "SELECT m.id, m.content_hash FROM memories m WHERE NOT EXISTS (SELECT 1 FROM reembedded r "
                "WHERE r.id = m.id AND r.content_hash = m.content_hash AND r.model = ?) ORDER BY m.id",
                [model]).fetchall()
            for start in range(0, len(todo), batch_size):
                chunk = todo[start:start + batch_size]
                hashes = dict(chunk)
                texts = {mid: content for mid, content, digest in lake.con.execute(
                    "SELECT id, content, content_hash FROM memories WHERE id IN (SELECT unnest(?))",
                    [list(hashes)]).fetchall() if hashes[mid] == digest}
                chunk = [c for c in chunk if c[0] in texts]  # replaced or forgotten since: the next round
                t1 = time.perf_counter()
                vectors = _embed_batched(embedder, [texts[c[0]] for c in chunk], settings.embed_batch_size, progress)
                embed_s += time.perf_counter() - t1
                _stage(lake, model, chunk, vectors)
                report.batches += 1
                if on_batch is not None:
                    on_batch(report.batches, len(chunk))
            swapped = _swap(lake, model, embedder.dim)
            if swapped is not None:
                report.version, report.memories = swapped
                break
        else:
            raise StoreError(f"dimple reembed: memories kept being written faster than they were embedded "
                             f"({ROUNDS} rounds); run it again (what is embedded stays)")
    finally:
        lake.close()
    if report.memories:
        follower = Follower(settings)
        try:
            report.version = follower.build_after_write(report.version)[1]
        finally:
            follower.close()
    report.seconds = {"embed": embed_s, "total": time.perf_counter() - t0}
    return report


def _one(lake: Lake, sql: str, params: list) -> int:
    row = one(lake.con.execute(sql, params))
    return int(row[0]) if row and row[0] is not None else 0


def _drop_other_models(lake: Lake, model: str) -> None:
    """Drop the new vectors an earlier run left for another model (one commit, when any)."""
    if not _one(lake, "SELECT count(*) FROM reembedded WHERE model <> ?", [model]):
        return

    def once() -> None:
        lake.con.execute("BEGIN TRANSACTION")
        lake.con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', 'reembed: other model dropped')")
        lake.con.execute("DELETE FROM reembedded WHERE model <> ?", [model])
        lake.con.execute("COMMIT")

    retrying(lake.con, once, deadline_s=lake.settings.write_wait_s, what="dropping another model's new vectors")


def batch_id(model: str, chunk: list[tuple[str, str]]) -> str:
    """A batch's write id: the same model, ids and content hashes, the same id."""
    digest = hashlib.blake2b(json.dumps([model, chunk]).encode(), digest_size=10).hexdigest()
    return f"reembed-{digest}"


def _stage(lake: Lake, model: str, chunk: list[tuple[str, str]], vectors: np.ndarray) -> None:
    """Commit one batch's new vectors (nothing when a batch of that id is there)."""
    wid = batch_id(model, chunk)

    def once() -> None:
        con = lake.con
        con.execute("BEGIN TRANSACTION")
        if _one(lake, "SELECT count(*) FROM reembedded WHERE batch = ?", [wid]):
            con.execute("ROLLBACK")
            return
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', ?)", [wid])
        con.execute("INSERT INTO reembedded SELECT unnest(?), unnest(?), ?, unnest(?), ?",
                    [[c[0] for c in chunk], [c[1] for c in chunk], model, [vector_bytes(v) for v in vectors], wid])
        con.execute("COMMIT")

    retrying(lake.con, once, deadline_s=lake.settings.write_wait_s, what=f"reembed batch {wid}")


def _swap(lake: Lake, model: str, dim: int) -> tuple[int, int] | None:
    """In one transaction, serialised with every write: when every live memory
    has its new vector, put them in place and record ``model``/``dim``;
    (the snapshot, the memories), or None when some are missing (written meanwhile)."""
    def once() -> tuple[int, int] | None:
        con = lake.con
        con.execute("BEGIN TRANSACTION")
        con.execute("UPDATE write_head SET seq = seq + 1")  # a write committed meanwhile: one of us starts again
        missing, held = one(con.execute(
            "SELECT count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM reembedded r WHERE r.id = m.id AND "
            "r.content_hash = m.content_hash AND r.model = ?)), count(*) FROM memories m", [model])) or (0, 0)
        if missing:
            con.execute("ROLLBACK")
            return None
        con.execute(f"CALL ducklake_set_commit_message('{LAKE}', 'dimple', ?)", [f"{REEMBED_MESSAGE} {model}"])
        con.execute("UPDATE memories SET embedding = r.embedding FROM (SELECT id, content_hash, any_value(embedding) "
                    "AS embedding FROM reembedded WHERE model = ? GROUP BY id, content_hash) r "
                    "WHERE memories.id = r.id AND memories.content_hash = r.content_hash", [model])
        con.execute("UPDATE lake_meta SET value = ? WHERE key = 'embedding_model'", [model])
        con.execute("UPDATE lake_meta SET value = ? WHERE key = 'embedding_dim'", [str(dim)])
        con.execute("DELETE FROM reembedded")
        con.execute("INSERT INTO writes VALUES (?, ?, ?, 0)", [f"reembed-{model}-{utcnow().isoformat()}", utcnow(),
                                                              held])
        con.execute("COMMIT")
        row = one(con.execute(f"SELECT id FROM ducklake_last_committed_snapshot('{LAKE}')"))
        if row is None or row[0] is None:
            raise StoreError("the catalog named no snapshot for the re-embedding's commit")
        return int(row[0]), int(held)

    return retrying(lake.con, once, deadline_s=lake.settings.write_wait_s, what="reembed: the new vectors in place")[0]
