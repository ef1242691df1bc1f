"""What the query path reads from the lake (``pipeline.store.lake.derive``):
a base built from a snapshot and an overlay built from the changes since it.
The promise a reader leans on: a base of an older snapshot with every later
snapshot merged over it answers every query as a base built at the latest
snapshot does (ids, order, ranks and scores, in every mode), whatever the
history of writes, replacements, links and forgets in between. (Until
``dimple migrate`` replaced it, the same writes sent to the segment store were
checked to answer alike too; test_lake_migrate checks a migrated store.)"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from pipeline.contracts import Batch, Results, make_query
from pipeline.embedders import HashEmbedder
from pipeline.errors import InputError, StoreError
from pipeline.stages.registry import run_local
from pipeline.store.compact import fresh_base
from pipeline.store.database import Store, utcnow
from pipeline.store.ingest import embedding_text
from pipeline.store.lake import Lake, LakeMemory, LakeWrite
from pipeline.store.lake.derive import base_snapshot, build_base, deltas_since, open_view
from pipeline.store.reader import Snapshot
from pipeline.store.writes import parse_records
from tests.lakes import Pinned
from workers.settings import WorkerSettings

DIM = 64
WORDS = ("deploy window friday backup restore alpha beta gamma delta kappa lambda migration schema index cache "
         "latency queue worker broker redis duckdb vector tree leaf topic budget scope audit").split()
START = datetime(2025, 1, 1, tzinfo=UTC)


def _settings(tmp_path, name: str) -> WorkerSettings:
    """A beam that reaches every leaf, so the vector leg is exact whatever
    tree each base grew."""
    return WorkerSettings(data_dir=tmp_path / name, embedding_model=f"hash-{DIM}", _env_file=None,
                          tree={"beam_width": 1024, "max_leaf_items": 8}, compact_max_deltas=10_000)


@pytest.fixture
def stores(tmp_path):
    """(the settings of an empty lake, the lake open)."""
    lake_settings = _settings(tmp_path, "lake")
    lake = Lake.open(lake_settings, embedding_model=lake_settings.embedding_model, embedding_dim=DIM)
    yield lake_settings, lake
    lake.close()


# -- one random history, sent to both stores ------------------------------------------------------
class History:
    """Random writes: remember batches (new memories, replacements with new
    text, links to live memories), forgets, and memories remembered again after
    being forgotten; every record names its ``created_at`` (the lake's write
    path does not yet keep a replaced memory's)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.live: set[str] = set()
        self.forgotten: set[str] = set()
        self.linked: set[str] = set()  # ever a link's target: never remembered again once forgotten (LAKE.md)
        self.next = 0
        self.edit = 0

    def _text(self, mid: str) -> str:
        self.edit += 1
        words = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(3, 12)))
        return f"{words} tok{mid[1:]} rev{self.edit}"

    def record(self, mid: str, peers: set[str]) -> dict:
        rng = self.rng
        rec = {"id": mid, "namespace": f"ns{rng.randrange(3)}", "content": self._text(mid),
               "content_type": rng.choice(("note", "log")),
               "created_at": (START + timedelta(hours=rng.randrange(5000))).isoformat()}
        if rng.random() < 0.3:
            rec["topics"] = rng.sample(["ops", "db", "people"], rng.randint(1, 2))
        if rng.random() < 0.2:
            rec["concepts"] = [rng.choice(["redis", "friday"])]
        if rng.random() < 0.2:
            rec["context"] = f"asked about {rng.choice(WORDS)}"
        if rng.random() < 0.2:
            rec["metadata"] = {"n": rng.randrange(9), "tags": ["a", rng.choice(WORDS)]}
        targets = sorted((self.live | peers) - {mid})  # live memories, or others of the same write
        if targets and rng.random() < 0.35:
            kind = rng.choice(("supersedes", "supersedes", "conflicts", "supported_by"))
            rec[kind] = rng.sample(targets, 1)
            self.linked |= set(rec[kind])
        return rec

    def batch(self, size: int) -> list[dict]:
        rng = self.rng
        ids: list[str] = []
        for _ in range(size):
            roll = rng.random()
            again = sorted(self.forgotten - self.linked - set(ids))
            old = sorted(self.live - set(ids))
            if roll < 0.25 and old:
                ids.append(rng.choice(old))
            elif roll < 0.32 and again:
                ids.append(rng.choice(again))
            else:
                ids.append(f"m{self.next}")
                self.next += 1
        out = [self.record(mid, set(ids)) for mid in ids]
        self.live |= set(ids)
        self.forgotten -= set(ids)
        return out

    def forget(self, n: int) -> list[str]:
        ids = self.rng.sample(sorted(self.live), min(n, len(self.live)))
        self.live -= set(ids)
        self.forgotten |= set(ids)
        return ids

    def writes(self, n: int) -> Iterator[tuple[str, object]]:
        for _ in range(n):
            if self.rng.random() < 0.25:
                yield "forget", self.forget(self.rng.randint(1, 6))
            else:
                yield "remember", self.batch(self.rng.choice((1, 1, 2, 5, 12)))


def send(settings: WorkerSettings, lake: Lake, op: str, arg) -> int:
    """One write, committed as the write path commits it; its snapshot."""
    if op == "forget":
        return lake.commit(LakeWrite(forget=list(arg))).snapshot
    records = parse_records(arg, settings).records
    vectors = HashEmbedder(DIM).embed([embedding_text(r) for r in records])
    now = utcnow()
    return lake.commit(LakeWrite([LakeMemory.from_record(r, vectors[i], now) for i, r in enumerate(records)])).snapshot


# -- searching either store -------------------------------------------------------------------------
QUERIES = ["deploy window", "alpha beta gamma", "tok3 tok25 tok40", "cache latency queue", "friday",
           "schema index migration tree", "tok41 restore", "audit budget scope leaf", "redis broker worker"]
OPTIONS = [{}, {"namespace": "ns1"}, {"content_type": "log"}, {"topics": ["ops"]}, {"concepts": ["redis"]},
           {"namespace": "ns0", "supersession": "hide"}, {"supersession": "annotate", "top_k": 30}]


def answers(res: Pinned, settings, options_sets: list[dict] = OPTIONS) -> dict:
    out = {}
    for text in QUERIES:
        for mode in ("keyword", "semantic", "hybrid"):
            for i, options in enumerate(options_sets):
                query = make_query(text, {**options, "mode": mode, "now": "2026-01-01T00:00:00"}, settings)
                got = Results.from_state(run_local(Batch(states=[{"query": query}]), res).states[0])
                out[text, mode, i] = [(r.id, r.score, r.ranks, [link.id for link in r.superseded_by],
                                       r.promoted_above) for r in got.results] + [got.hidden_superseded]
    return out


def _same(left: list, right: list, rtol: float) -> bool:
    strip = [[r[:1] + r[2:] if isinstance(r, tuple) else r for r in side] for side in (left, right)]
    scores = [[r[1] for r in side if isinstance(r, tuple)] for side in (left, right)]
    return strip[0] == strip[1] and np.allclose(scores[0], scores[1], rtol=rtol, atol=0)


def assert_same_answers(left: dict, right: dict) -> None:
    """Ids, order, ranks and links exactly; scores to the last bits of a
    float64 in keyword mode (a base with snapshots merged over it and a base
    built at the latest number their full-text terms and documents apart, so
    a scoped BM25 sum may add the same terms in another order: 0.8349083361381077
    against ...078), to a float32's where the vector leg scores (the base's
    index and the overlay's rows are float32 dot products summed apart: CI saw
    0.7499999525847896 against 0.7500000790253506, two ulps)."""
    assert left.keys() == right.keys()
    bad = [k for k in left if not _same(left[k], right[k], 1e-12 if k[1] == "keyword" else 1e-6)]
    assert not bad, f"{len(bad)} of {len(left)} answers differ, e.g. {bad[0]}: {left[bad[0]]} vs {right[bad[0]]}"
    filled = sum(len(v) > 5 for v in left.values())
    assert filled >= len(left) * 0.5, "the comparison must not pass on empty answers"


def overlay_facts(snap: Snapshot) -> dict:
    """Everything an ``Overlay`` holds that a query reads, its delta numbering left out."""
    o = snap.overlay
    return {"members": {m: o.members[m].to_json() for m in o.members}, "touched": o.touched,
            "forgotten": o.forgotten, "dead_ids": o.dead_ids, "dead_docids": sorted(o.dead_docids),
            "base": (o.base_docs, o.base_len), "ids": o.ids, "emb": o.emb.tobytes(), "lens": o.lens.tolist(),
            "postings": {t: (r.tolist(), f.tolist()) for t, (r, f) in o.postings.items()}}


# -- the tests ----------------------------------------------------------------------------------------
TABLES = ("memories", "topics", "memory_topics", "memory_concepts", "edges", "fts_docs", "fts_terms", "fts_postings")


def _rows(store: Store, table: str) -> list:
    # fts_postings' lists are in no particular order (fulltext.index): compared sorted
    cols = {"memories": "* EXCLUDE (ingested_at)", "fts_postings": "termid, df, list_sort(postings)"}.get(table, "*")
    return store.con.execute(f"SELECT {cols} FROM {table} ORDER BY ALL").fetchall()


def test_a_base_from_a_snapshot_holds_that_snapshot_and_nothing_later(stores, tmp_path):
    lake_settings, lake = stores
    history = History(3)
    first = history.batch(150)
    b = send(lake_settings, lake, "remember", first)
    for op, arg in history.writes(6):  # later snapshots: the base at b must not see them
        send(lake_settings, lake, op, arg)
    path = build_base(lake, b, tmp_path / "indexes" / f"base-{b}.duckdb", lake_settings)
    # the same first write alone, in a lake of its own
    alone_settings = _settings(tmp_path, "alone")
    with Lake.open(alone_settings, embedding_model=alone_settings.embedding_model, embedding_dim=DIM) as alone:
        only = send(alone_settings, alone, "remember", first)
        other = build_base(alone, only, tmp_path / "alone-indexes" / f"base-{only}.duckdb", alone_settings)
    with Store.open(path, read_only=True) as ours, Store.open(other, read_only=True) as theirs:
        assert base_snapshot(ours) == b and base_snapshot(theirs) == only
        assert ours.count() == 150
        for table in TABLES:
            mine = _rows(ours, table)
            assert mine == _rows(theirs, table), table
            assert mine, table


def test_a_base_is_refused_inside_the_data_path_over_an_old_file_or_at_an_unknown_snapshot(stores, tmp_path):
    lake_settings, lake = stores
    record = parse_records({"id": "a", "namespace": "n", "content": "x"}, lake_settings).records[0]
    b = lake.commit(LakeWrite([LakeMemory.from_record(record, np.eye(DIM)[0], utcnow())]))
    with pytest.raises(StoreError, match="^store.data_path: "):
        build_base(lake, b.snapshot, lake.data_path / "base.duckdb", lake_settings)
    path = build_base(lake, b.snapshot, tmp_path / "base.duckdb", lake_settings)
    with pytest.raises(StoreError, match="exists"):
        build_base(lake, b.snapshot, path, lake_settings)
    with pytest.raises(InputError, match="^as_of: no snapshot"):
        build_base(lake, b.snapshot + 9, tmp_path / "later.duckdb", lake_settings)
    assert not (tmp_path / "later.duckdb").exists() and not (tmp_path / "later.duckdb.work").exists()
    # a base file that records no snapshot (the segment store's were such)
    foreign = tmp_path / "foreign.duckdb"
    fresh_base(foreign, [record], {"a": np.eye(DIM)[0].astype(np.float32)}, lake_settings,
               embedding_model=lake_settings.embedding_model, embedding_dim=DIM)
    with pytest.raises(StoreError, match="not a base built from the lake"):
        open_view(lake, foreign, lake_settings)


def test_the_overlay_from_changes_holds_each_snapshot_since_the_base(stores, tmp_path):
    lake_settings, lake = stores
    history = History(11)
    b = send(lake_settings, lake, "remember", history.batch(120))
    base = build_base(lake, b, tmp_path / "indexes" / f"base-{b}.duckdb", lake_settings)
    sent = [send(lake_settings, lake, op, arg) for op, arg in history.writes(25)]
    ours = open_view(lake, base, lake_settings)
    try:
        assert ours.version == lake.latest_snapshot() == sent[-1] and ours.overlay.seqs == sent
        facts = overlay_facts(ours)
        assert set(facts["members"]) | set(facts["forgotten"]) <= set(history.live) | set(history.forgotten)
        assert set(facts["forgotten"]) & set(history.forgotten) and facts["dead_ids"]
        assert any(m["tree"] for m in facts["members"].values())
        assert any(m["supersedes"] for m in facts["members"].values())
        # an older view: the changes up to a snapshot only
        middle = ours.overlay.seqs[len(ours.overlay.seqs) // 2]
        early = open_view(lake, base, lake_settings, until=middle)
        assert early.version == middle and early.overlay.seqs == [s for s in ours.overlay.seqs if s <= middle]
        early.close()
    finally:
        ours.close()


def test_deltas_of_a_replacement_and_a_forget_in_one_history(stores, tmp_path):
    lake_settings, lake = stores
    history = History(5)
    b = send(lake_settings, lake, "remember", history.batch(30))
    keep, gone = sorted(history.live)[:2]
    replaced = history.record(keep, set())
    s1 = send(lake_settings, lake, "remember", [replaced])
    s2 = send(lake_settings, lake, "forget", [gone])
    base = build_base(lake, b, tmp_path / "base.duckdb", lake_settings)
    with Store.open(base, read_only=True) as store:
        from pipeline.store.vector import TreeRouter

        deltas = deltas_since(lake.changes_since(b), TreeRouter.load(store.con), lake_settings, DIM)
    assert list(deltas) == [s1, s2]
    assert [m.id for m in deltas[s1].memories] == [keep] and deltas[s1].forget == []
    assert deltas[s1].memories[0].content == replaced["content"] and deltas[s1].memories[0].tree
    assert deltas[s2].memories == [] and deltas[s2].forget == [gone] and deltas[s2].vectors.shape == (0, DIM)


def test_search_over_a_base_and_the_snapshots_since_answers_as_over_a_base_at_the_latest(stores, tmp_path):
    lake_settings, lake = stores
    history = History(29)
    b = send(lake_settings, lake, "remember", history.batch(200))
    for op, arg in history.writes(40):
        send(lake_settings, lake, op, arg)
    base = build_base(lake, b, tmp_path / "indexes" / f"base-{b}.duckdb", lake_settings)
    latest = lake.latest_snapshot()
    fresh = build_base(lake, latest, tmp_path / "indexes" / f"base-{latest}.duckdb", lake_settings)
    merged, whole = open_view(lake, base, lake_settings), open_view(lake, fresh, lake_settings)
    try:
        assert merged.overlay.dead_ids and merged.overlay.forgotten and whole.overlay.empty
        assert merged.version == whole.version == latest and whole.store.count() == len(history.live)
        assert_same_answers(answers(Pinned(lake_settings, merged), lake_settings),
                            answers(Pinned(lake_settings, whole), lake_settings))
        # a topic of the old base's tree, the leaf most new memories were routed to: a
        # query scoped to it finds them there
        leaf, routed = Counter(m.tree[0] for m in merged.overlay.members.values() if m.tree).most_common(1)[0]
        assert routed >= 2
        found = answers(Pinned(lake_settings, merged), lake_settings, [{"topics": [leaf]}])
        ids = {r[0] for k, v in found.items() if k[1] == "semantic" for r in v if isinstance(r, tuple)}
        assert ids & {m for m, d in merged.overlay.members.items() if d.tree and d.tree[0] == leaf}
    finally:
        merged.close()
        whole.close()


def test_sweep_builds_deletes_what_dead_builders_left_and_keeps_live_ones(tmp_path):
    """``sweep_builds``: this host's partial bases whose process is gone go;
    a live builder's (this process) stays; another host's stays until
    ``STALE_BUILD_S`` has passed; bases themselves are never touched."""
    import os
    import subprocess
    import sys

    from pipeline.store.lake.derive import STALE_BUILD_S, build_path, sweep_builds

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    ours = build_path(tmp_path / "base-9.duckdb")
    host = ours.name.split(".")[2]
    left = tmp_path / f".base-7.{host}.{dead_pid}.1.duckdb.work"
    other_host = tmp_path / ".base-7.elsewhere.1.1.duckdb.work"
    old_other = tmp_path / ".base-5.elsewhere.2.1.duckdb"
    base = tmp_path / "base-7.duckdb"
    for path in (ours.with_name(ours.name + ".work"), left, other_host, old_other, base):
        path.write_bytes(b"x")
    aged = os.stat(old_other).st_mtime - STALE_BUILD_S - 60
    os.utime(old_other, (aged, aged))
    assert sorted(sweep_builds(tmp_path)) == sorted([left.name, old_other.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ours.name + ".work", other_host.name, base.name])
