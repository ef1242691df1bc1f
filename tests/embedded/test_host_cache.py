"""The host cache on the lake (docs/LAKE.md, "The host cache";
``pipeline.store.hostcache``): a base's vector index, postings and graph are written
once per host as ``.npy`` files and memory-mapped by every process, with the
answers of a process that reads its own copy (ids, order, scores, both legs);
a second process maps what the first wrote; a partial or damaged file is
written again, never served; a folder of a base compaction dropped is deleted
by the next process that puts a newer base in use; and a base file gone
between the listing and the open sends the follower to the newer base.
Real DuckDB files, a SQLite catalog, the hash embedder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.contracts import Batch, Results, make_query
from pipeline.stages.registry import run_local
from pipeline.store.lake import Lake, follow
from pipeline.store.lake.follow import Follower, cache_dir
from pipeline.store.reader import Reader, Snapshot
from tests.conftest import store_settings
from tests.lakes import Pinned, age_forgets

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ["deploy window friday", "cache latency spike", "schema migration plan", "quokka car park", "note 17",
           "restore backup tuesday"]
OPTIONS = [{}, {"namespace": "ns1"}, {"content_type": "log"}]


@pytest.fixture
def settings(tmp_path):
    settings = store_settings(tmp_path)
    settings.audit_enabled = False
    return settings


def _remember(n: int = 300) -> None:
    from workers.api import forget, remember

    topics = ["deploy window friday", "cache latency spike", "schema migration plan", "car park quokka",
              "restore the backup on tuesday", "broker queue worker"]
    remember([{"id": f"m{i}", "namespace": f"ns{i % 3}", "content_type": ("note", "log")[i % 2],
               "content": f"note {i} about the {topics[i % len(topics)]} and item {i * 7 % 31}"}
              for i in range(n)])  # the first write: the first base
    remember([{"id": f"late{i}", "namespace": "ns1", "content": f"late note {i}: the {topics[i % 4]} again"}
              for i in range(5)])  # over the base: the overlay
    forget(["m5", "m6"])


def _answers(settings, snap: Snapshot) -> dict:
    res = Pinned(settings, snap)
    out = {}
    for text in QUERIES:
        for mode in ("keyword", "semantic", "hybrid"):
            for i, options in enumerate(OPTIONS):
                query = make_query(text, {**options, "mode": mode, "now": "2026-01-01T00:00:00"}, settings)
                got = Results.from_state(run_local(Batch(states=[{"query": query}]), res).states[0])
                out[f"{text}|{mode}|{i}"] = [[r.id, r.score, r.ranks] for r in got.results]
    return out


def _reader(settings, *, host_cache: bool = True) -> Reader:
    return Reader(settings.data_dir, lake=Follower(settings, host_cache=host_cache))


def _read(settings, *, host_cache: bool = True) -> tuple[dict, Snapshot, Reader]:
    """Answers of a fresh reader, its snapshot (indexes loaded) and the reader (to close)."""
    reader = _reader(settings, host_cache=host_cache)
    snap = reader.snapshot()
    assert snap is not None
    return _answers(settings, snap), snap, reader


def _part(settings, snap: Snapshot, part: str) -> Path:
    return cache_dir(settings) / Path(snap.base).stem / part


def test_answers_equal_with_and_without_the_host_cache_and_the_arrays_are_mapped(embedded):
    _remember()
    without, plain, r1 = _read(embedded, host_cache=False)
    assert not cache_dir(embedded).exists(), "a reader without the cache writes none"
    cached, snap, r2 = _read(embedded)
    try:
        assert sum(len(v) for v in without.values()) > 300, "the comparison must not pass on empty answers"
        assert cached == without  # ids, order, scores to the last bit, ranks per leg
        assert not snap.overlay.empty  # the base and the writes over it
        index, postings, graph = snap.index(), snap.postings(), snap.graph_part()
        assert index is not None and postings is not None and graph is not None
        # read-only views of files in the host cache, not this process's copies
        for array in (index.emb, index.id_rank, postings.docid, postings.tf, postings.lens, graph.a["content"],
                      graph.a["ids"]):
            assert not array.flags.writeable and not array.flags.owndata
        assert plain.index().emb.flags.writeable
        assert plain.graph_part() is None  # without the cache, augment reads the base by SQL
        for part in ("vector", "postings", "graph"):
            assert (_part(embedded, snap, part) / "manifest.json").is_file()
        assert sorted(snap._uses.cache.written) == ["graph", "postings", "vector"]
    finally:
        r1.close()
        r2.close()


_SECOND = """
import json, sys
from pathlib import Path
from pipeline.settings import Settings
from pipeline.store.lake.follow import reader_for
from tests.embedded.test_host_cache import _answers
settings = Settings()
reader = reader_for(settings)
snap = reader.snapshot()
cache = snap._uses.cache
out = {"answers": _answers(settings, snap), "written": cache.written, "read": cache.read, "base": snap.base}
reader.close()
Path(sys.argv[1]).write_text(json.dumps(out))
"""


def _env(settings) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DIMPLE_DATA_DIR": str(settings.data_dir),
            "DIMPLE_EMBEDDING_MODEL": "hash-64", "DIMPLE_AUDIT_ENABLED": "false"}


def test_a_second_process_maps_the_cache_the_first_wrote_without_writing_it_again(embedded, tmp_path):
    _remember()
    ours, snap, reader = _read(embedded)
    try:
        parts = {p: _part(embedded, snap, p) for p in ("vector", "postings")}
        before = {p: (f.stat().st_ino, (f / "emb.npy" if p == "vector" else f / "docid.npy").stat().st_ino)
                  for p, f in parts.items()}
        out = tmp_path / "second.json"
        done = subprocess.run([sys.executable, "-c", _SECOND, str(out)], cwd=tmp_path, env=_env(embedded),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        theirs = json.loads(out.read_text())
        assert theirs["base"] == snap.base
        assert theirs["read"] == theirs["written"] == []  # found whole: mapped, not read nor written
        assert theirs["answers"] == json.loads(json.dumps(ours))
        after = {p: (f.stat().st_ino, (f / "emb.npy" if p == "vector" else f / "docid.npy").stat().st_ino)
                 for p, f in parts.items()}
        assert after == before
    finally:
        reader.close()


@pytest.mark.parametrize("damage", ["partial", "flipped"])
def test_a_partial_or_damaged_cache_file_is_written_again_not_served(embedded, damage):
    _remember()
    baseline, snap, reader = _read(embedded)
    emb = _part(embedded, snap, "vector") / "emb.npy"
    docid = _part(embedded, snap, "postings") / "docid.npy"
    sizes = {emb: emb.stat().st_size, docid: docid.stat().st_size}
    reader.close()
    for path in (emb, docid):
        data = bytearray(path.read_bytes())
        if damage == "partial":
            data = data[: len(data) // 2]  # a file cut short (a copy or a disk that stopped midway)
        else:
            for at in range(len(data) - 64, len(data), 4):  # the last rows: same size, other bytes
                data[at] ^= 0x5A
        path.write_bytes(bytes(data))
    again, snap2, reader2 = _read(embedded)
    try:
        assert again == baseline
        assert snap2._uses.cache.written == ["vector", "postings"]
        assert {p: p.stat().st_size for p in sizes} == sizes
    finally:
        reader2.close()


def _erase_and_compact(settings) -> None:
    """Forget a memory, age the forget past ``store.erase_within`` and compact:
    a new base, every older one dropped (file and ``indexes`` row)."""
    from pipeline.store.maintenance import compact
    from workers.api import forget

    forget(["m7"])
    age_forgets(settings)
    assert compact(settings, wait=True).ran


def test_the_folder_of_a_base_compaction_dropped_is_deleted_by_the_next_process_to_load(embedded):
    _remember()
    _, old, reader = _read(embedded)
    old_folder = _part(embedded, old, "vector").parent
    assert old_folder.is_dir()
    _erase_and_compact(embedded)
    assert not Path(old.base).exists()  # the old base file went with the erase
    # this process still reads the old base: its mapped arrays answer
    assert old.index() is not None and len(old.index().emb) == 300
    reader.wait_ready()  # the new base in use: the old folder deleted
    snap = reader.snapshot()
    assert snap.base != old.base
    assert not old_folder.exists()
    _answers(embedded, snap)
    assert _part(embedded, snap, "vector").is_dir()
    reader.close()


def test_a_base_file_gone_between_the_listing_and_the_open_sends_the_follower_to_the_newer_one(embedded,
                                                                                              monkeypatch):
    _remember()
    _, old, reader = _read(embedded)
    stale = follow.listed(reader.lake.lake())  # the listing before another host's compaction
    reader.close()
    _erase_and_compact(embedded)
    with Lake.open(embedded) as lake:
        newest = follow.listed(lake)
        latest = lake.latest_snapshot()
    assert len(newest) == 1 and not any(p.exists() for p in stale.values())
    real = follow.listed
    calls = []

    def listed_once_stale(lake):  # the first look at the listing was taken before the compaction
        calls.append(1)
        return stale if len(calls) == 1 else real(lake)

    monkeypatch.setattr(follow, "listed", listed_once_stale)
    fresh = _reader(embedded)
    try:
        snap = fresh.snapshot()
        assert snap is not None and snap.base == str(newest[max(newest)])
        calls.clear()
        past = fresh.as_of(latest)  # as_of: the same
        assert past.base == str(newest[max(newest)])
    finally:
        fresh.close()
    with Lake.open(embedded) as lake:
        assert real(lake) == newest  # taken, not built again


def test_two_processes_starting_at_once_read_each_part_once_and_leave_the_cache_whole(embedded, tmp_path):
    _remember()
    ours, _, reader = _read(embedded, host_cache=False)
    reader.close()
    outs = [tmp_path / f"racer{i}.json" for i in range(2)]
    racers = [subprocess.Popen([sys.executable, "-c", _SECOND, str(out)], cwd=tmp_path, env=_env(embedded),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for out in outs]
    for racer in racers:
        _, err = racer.communicate(timeout=300)
        assert racer.returncode == 0, err
    got = [json.loads(out.read_text()) for out in outs]
    for theirs in got:
        assert theirs["answers"] == json.loads(json.dumps(ours))
    for part in ("vector", "postings", "graph"):  # each part read by one (the other waits its turn, then maps it)
        assert sum(part in theirs["written"] for theirs in got) == 1
        assert sum(part in theirs["read"] for theirs in got) == 1
        assert all(part in theirs["read"] for theirs in got if part in theirs["written"])
    # a third process finds both parts whole: maps them, writes nothing
    third = tmp_path / "third.json"
    done = subprocess.run([sys.executable, "-c", _SECOND, str(third)], cwd=tmp_path, env=_env(embedded),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(third.read_text())["read"] == []
    leftovers = [p for p in cache_dir(embedded).rglob(".*")]
    assert leftovers == []  # no temporary folder left behind


def test_a_cache_that_cannot_be_written_leaves_the_process_its_own_copy_and_the_same_answers(embedded, monkeypatch):
    """The cache is this host's economy, never a reason to fail a read: a part
    that cannot be written (the folder swept by another process, a full disk)
    is served from the copy this process read."""
    from pipeline.store import hostcache

    _remember()
    without, _, r1 = _read(embedded, host_cache=False)

    def fails(self, target, arrays, lists):
        raise FileNotFoundError(f"{target.parent} was swept meanwhile")

    monkeypatch.setattr(hostcache.HostCache, "_write", fails)
    answers, snap, r2 = _read(embedded)
    try:
        assert answers == without and sum(len(v) for v in answers.values()) > 300
        assert snap.index().emb.flags.writeable  # its own copy, not a mapped file
        assert snap._uses.cache.written == []
    finally:
        r1.close()
        r2.close()


def test_after_an_erase_no_host_cache_keeps_the_dropped_base_the_compacting_host_at_once_others_at_their_check(
        tmp_path):
    """Two hosts over one lake, each with a cache of the base: host A's erase
    deletes its own cache of the dropped base at once, and host B's upkeep
    check (``Follower.clear_cache``, once a minute in its ingest workers)
    deletes B's, though no search process of B loaded the new base: the
    forgotten memory is then in no file of either data dir."""
    import workers
    from pipeline.settings import StoreSettings
    from workers import audit, resources

    shared = {"catalog": f"sqlite:{tmp_path / 'shared' / 'lake.sqlite'}",
              "data_path": tmp_path / "shared" / "lake", "index_path": tmp_path / "shared" / "indexes"}
    a = store_settings(tmp_path).replace(data_dir=tmp_path / "a", audit_enabled=False, store=StoreSettings(**shared))
    b = a.replace(data_dir=tmp_path / "b")
    workers.configure(a)
    try:
        _remember()
        _, snap_a, reader_a = _read(a)
        _, snap_b, reader_b = _read(b)
        folder_a, folder_b = (_part(s, snap, "vector").parent for s, snap in ((a, snap_a), (b, snap_b)))
        assert folder_a.is_dir() and folder_b.is_dir()
        assert any(b'"m7"' in p.read_bytes() for p in folder_b.rglob("*") if p.is_file())
        reader_b.close()  # host B's search processes: none running now

        _erase_and_compact(a)
        assert not folder_a.exists()  # the compacting host: at once
        assert folder_b.is_dir()  # host B: not yet
        follower = Follower(b)
        try:
            assert follower.clear_cache() == [folder_b.name]
        finally:
            follower.close()
        assert not folder_b.exists()
        for root in (a.data_dir, b.data_dir):
            assert not [p for p in root.rglob("*") if p.is_file() and b'"m7"' in p.read_bytes()]
        reader_a.close()
    finally:
        audit.flush()
        resources.current().close_store()
