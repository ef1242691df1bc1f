"""The lake's durability goal (issue 34 item 8), with ``store.engine = lake``
set: a writer SIGKILLed at random points many times, on the SQLite catalog
(the default) and on PostgreSQL where a server is found; and the real
``ingest`` worker SIGKILLed while it holds a write (``tests/kills.py``).

The writer uses the hash embedder: the embedder is not what a kill can
break, and the real model would cost each round's new process seconds to
load and put most kills inside the embedding rather than in the store's
commit. The worker test uses the real model (it is the worker as deployed)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from pipeline.settings import StoreSettings
from pipeline.store.lake.follow import reader_for
from tests.kills import IngestWorkerKills, kill_writer, settings_for, twice_applied
from tests.lakes import find_postgres

LAKE = StoreSettings(engine="lake")
# Seconds of writing before each kill: a one-memory write on the lake takes
# 0.2-1.2 s here under load, so a kill lands anywhere in the first few writes.
WINDOW = (0.05, 1.5)


def test_writer_killed_sixteen_times_on_the_sqlite_catalog(tmp_path):
    report = kill_writer(settings_for(tmp_path / "data", LAKE), rounds=16, rng=random.Random(34), window=WINDOW)
    assert report.in_flight >= 8, "most kills caught a write between sending and acknowledgement"
    print(f"\n{report.as_dict()}")


@pytest.fixture
def pg_catalog(tmp_path):
    server = find_postgres(tmp_path / "postgres")  # skips, naming what to install, when there is none
    conninfo = server.create_database()
    yield conninfo
    server.drop_database(conninfo)
    if server.proc is not None:
        server.proc.terminate()
        server.proc.wait(timeout=30)


def test_writer_killed_fourteen_times_on_the_postgresql_catalog(tmp_path, pg_catalog):
    store = StoreSettings(engine="lake", catalog=f"postgres:{pg_catalog}", data_path=tmp_path / "shared")
    report = kill_writer(settings_for(tmp_path / "data", store), rounds=14, rng=random.Random(35), window=WINDOW)
    assert report.in_flight >= 8, "most kills caught a write between sending and acknowledgement"
    print(f"\n{report.as_dict()}")


@pytest.mark.integration
def test_ingest_worker_killed_while_holding_a_write(tmp_path):
    """The real worker SIGKILLed (with its pool) a random moment after it took
    a write (the message held, not acknowledged), until three kills caught the
    write being awaited held: the next worker puts it back on the queue once
    its lease expired (``workers/leases.py``, the default timeout), applies it
    once, and the caller waiting on it gets its answer."""
    from workers.app import get_app

    rng = random.Random(36)
    with IngestWorkerKills(tmp_path / "run", tmp_path / "data", rng, store=LAKE) as kills:
        from workers.api import forget, remember, remember_async

        base = [{"id": f"base-{i}", "namespace": "k", "content": f"base memory {i} about the kill test"}
                for i in range(200)]
        remember(base)  # the lake's first write: it builds the base
        kills.remembered |= {r["id"] for r in base}
        kills.sent |= {r["id"] for r in base}
        caught = 0
        for r in range(8):
            stop = threading.Event()

            def holding_it() -> bool:  # the write awaited now, not one answered and not yet acknowledged
                return kills.where(kills.in_flight) == "held"

            def kill_when_holding(stop=stop) -> None:
                while not holding_it():
                    time.sleep(0.01)
                time.sleep(rng.uniform(0.0, 2.0))  # anywhere in the write: embedding, the commit, the answer
                while not holding_it():  # the write was answered meanwhile: the next one
                    time.sleep(0.01)
                kills.kill()
                stop.set()

            killer = threading.Thread(target=kill_when_holding, daemon=True)
            killer.start()
            kills.held = None
            kills.writes_until(stop.is_set, f"w{r}")
            killer.join()
            kills.check()  # the store opens; every acknowledged write is there, no forget undone
            # where the killed worker left the write awaited: held (its lease is no longer renewed),
            # or, rarely, answered just before the kill, or taken in kombu's window (then it is lost)
            where = kills.where(kills.held[0].id) if kills.held else "taken"
            kills.start()  # whose sweep puts a held one back on the queue (DIMPLE_VISIBILITY_TIMEOUT_S plus a sweep)
            if kills.held is None or where == "taken":
                print(f"\nkill {r + 1}: the write awaited was not held ({where}): not counted")
                continue
            handle, kind, mid = kills.held
            done = handle.get(timeout=120)  # the caller's answer, from the next worker
            if kind == "remember":
                assert done.ids == [mid] and (done.replayed or done.inserted == 1)
            else:
                assert done.forgotten == (0 if done.replayed else 1)
            kills.uncertain.discard(mid)
            (kills.remembered if kind == "remember" else kills.forgotten).add(mid)
            kills.check()
            print(f"\nkill {r + 1}: {kind} {mid} {where}: delivered again, replayed={done.replayed}")
            caught += where == "held"
            if caught == 3:
                break
        assert caught == 3, "three kills caught the worker holding a write"

        # an acknowledged write whose memory was forgotten since, delivered again: a replay, nothing changes
        record = {"id": "gone", "namespace": "k", "content": "remembered, forgotten, then delivered again"}
        first = remember_async(record)
        assert not first.get(timeout=120).replayed
        assert forget(["gone"]).forgotten == 1
        kills.forgotten.add("gone")
        get_app().tasks["ingest.remember"].apply_async(args=[[record], False], task_id=first.id)
        kills.drained()
        runs = kills.answers(first.id, runs=2)
        assert len(runs) == 2 and "'replayed': False" in runs[0] and "'replayed': True" in runs[1], runs
        kills.check()  # "gone" stays forgotten
        reader = reader_for(kills.settings)
        try:
            assert twice_applied(reader) == [], "no write applied twice"
        finally:
            reader.close()


def test_the_ingest_worker_killed_inside_a_compaction_leaves_the_store_whole_and_its_message_runs_again(tmp_path):
    """The real ``ingest`` worker SIGKILLed, with its pool, while
    ``ingest.compact`` builds a base: the store opens and holds every
    acknowledged write, the compaction's message (acks late) is delivered to
    the next worker, and there it runs at once: the dead pool process's claim
    of ``compaction_head`` is taken over, not waited out
    (``compaction.LEASE``), and the base the killed one was building is
    deleted."""
    from pipeline.store.lake import Lake
    from workers.app import get_app

    rng = random.Random(37)
    with IngestWorkerKills(tmp_path / "run", tmp_path / "data", rng, store=LAKE) as kills:
        from workers.api import forget, remember

        for b in range(2):  # 2,000 memories: a base build long enough to be killed inside
            batch = [{"id": f"c{b}-{i}", "namespace": f"ns{i % 4}", "content": f"note {i} of batch {b} on topic {i % 37}"}
                     for i in range(1000)]
            remember(batch)
            kills.remembered |= {r["id"] for r in batch}
        remember([{"id": "late", "namespace": "ns0", "content": "a late note"}])
        kills.remembered.add("late")
        assert forget(["c0-1"]).forgotten == 1
        kills.remembered.discard("c0-1")
        kills.forgotten.add("c0-1")
        kills.sent |= kills.remembered | kills.forgotten

        index = kills.settings.lake_index_path
        handle = get_app().tasks["ingest.compact"].apply_async(kwargs={"rebuild": True})
        deadline = time.monotonic() + 240
        while not list(index.glob(".base-*.duckdb*")):  # the base being built, under a name of its own
            assert time.monotonic() < deadline, "the compaction never started its base"
            time.sleep(0.005)
        assert kills.where(handle.id) == "held"
        kills.kill()
        with Lake.open(kills.settings) as lake:
            holder = lake.con.execute("SELECT holder FROM compaction_head").fetchone()[0]
        assert holder is not None, "killed while it held the claim"
        kills.check()  # the store opens; every acknowledged write is there, the forget stands

        kills.start()  # its lease sweep puts the held message back on the queue
        report = handle.get(timeout=240)  # the caller's answer, from the next worker's run
        assert report["ran"] and report["memories"] == len(kills.remembered), report
        kills.drained()
        with Lake.open(kills.settings) as lake:
            assert lake.con.execute("SELECT holder FROM compaction_head").fetchone() == (None,)
            listed = [r[0] for r in lake.con.execute("SELECT path FROM indexes").fetchall()]
        assert report["base"] in listed
        assert sorted(p.name for p in index.iterdir() if p.name.startswith(".")) == []
        kills.check()
