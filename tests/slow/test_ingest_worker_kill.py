"""The write path's durability goal with the real ``ingest`` worker: its
Celery process and pool SIGKILLed twenty times during writes and twenty
times during compactions, with the default settings: no acknowledged write
lost, no forgotten memory back, the store opens every time, and the writes
the killed workers held, delivered again once Redis' visibility timeout
passes, change nothing that was acknowledged (``tests/kills.py``)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from pipeline.settings import StoreSettings
from pipeline.store import segments
from tests.kills import IngestWorkerKills

pytestmark = pytest.mark.integration


def _compaction_runs(kills: IngestWorkerKills, within: float = 300.0) -> float:
    """Run a compaction that merges something and return how long it took.

    The writes send compactions of their own once the deltas pass their
    threshold. Ours then returns at once (one is running) or finds nothing to
    merge (one ran before it): wait for theirs, write one memory if nothing is
    left, and send ours again."""
    from workers.api import remember
    from workers.app import get_app

    deadline = time.monotonic() + within
    while True:
        with segments.compact_lock(kills.data_dir, wait=True):
            pass  # a compaction the writes sent is done
        if not segments.read_manifest(kills.data_dir).deltas:
            mid = f"extra-{len(kills.sent)}"
            kills.sent.add(mid)
            remember({"id": mid, "namespace": "k", "content": f"delta memory {mid}"})
            kills.remembered.add(mid)
        t0 = time.perf_counter()
        if get_app().tasks["ingest.compact"].apply_async().get(timeout=within)["ran"]:
            return time.perf_counter() - t0
        assert time.monotonic() < deadline, "no compaction merged the deltas"


def test_ingest_worker_killed_during_writes_and_compactions(tmp_path):
    rng = random.Random(18)
    with IngestWorkerKills(tmp_path / "run", tmp_path / "data", rng, store=StoreSettings(engine="segments")) as kills:
        from workers.api import forget, remember
        from workers.app import get_app

        base = [{"id": f"base-{i}", "namespace": "k", "content": f"base memory {i} about the kill test"}
                for i in range(1500)]
        remember(base)  # straight into a base
        kills.remembered |= {r["id"] for r in base}
        kills.sent |= {r["id"] for r in base}

        for r in range(20):  # killed while writing
            stop = threading.Event()
            timer = threading.Timer(rng.uniform(0.1, 2.0), lambda stop=stop: (kills.kill(), stop.set()))
            timer.start()
            kills.writes_until(stop.is_set, f"w{r}")
            timer.join()
            kills.check()
            kills.start()

        span = None
        for r in range(21):  # killed while compacting (round 0 times one)
            for j in range(3):
                mid = f"c{r}-{j}"
                kills.sent.add(mid)
                remember({"id": mid, "namespace": "k", "content": f"delta memory {mid}"})
                kills.remembered.add(mid)
            gone = rng.choice(sorted(kills.remembered - kills.forgotten - kills.uncertain))
            forget([gone])
            kills.forgotten.add(gone)
            if span is None:
                span = _compaction_runs(kills)
                continue
            get_app().tasks["ingest.compact"].apply_async()
            deadline = time.monotonic() + 60
            while True:  # until the compaction holds its lock
                with segments.compact_lock(kills.data_dir, wait=False) as free:
                    if not free:
                        break
                assert time.monotonic() < deadline, "the compaction did not start"
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, span))
            kills.kill()
            kills.check()
            kills.start()

        held = kills.redeliver_unacked()  # those not handed out again by now: as after the visibility timeout
        kills.drained()  # the compactions delivered again have run: they may have merged every delta
        kills.check()
        remember({"id": "after", "namespace": "k", "content": "written after the last kill"})
        kills.remembered.add("after")
        kills.sent.add("after")
        _compaction_runs(kills)  # a compaction after it all succeeds
        kills.check()
        print(f"\ningest worker SIGKILLed 40 times: {len(kills.remembered)} acknowledged writes kept, "
              f"{len(kills.forgotten)} forgets held, {len(kills.uncertain)} in flight at a kill, "
              f"{held} messages still held at the end, delivered again")
