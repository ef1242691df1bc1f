"""Three hosts, tested as hosts (issue 34 item 9): three network namespaces
on a bridge the test creates (``tests/hosts.py``), one redis-server and one
PostgreSQL catalog reached over that network, one shared data path, and on
each host its own data dir (its cache: bases, extension links), its own Celery
worker (``embed``, ``search`` and ``ingest``, two processes) and its own
processes that write (an agent through the broker) and search (in-process,
against that host's data dir). Every setting is the default but the store's
(``DIMPLE_STORE__ENGINE=lake``, ``__CATALOG=postgres:...``, ``__DATA_PATH``)
and the audit trail, which is off: the audit on several hosts is item 6 of
the issue (an outbox per host, ``retrieval_log`` in the lake), not built yet.

Checked: writes from two hosts at once all present once; every acknowledged
write answered by a search on every host within a bound (the times are
printed) and at once with ``min_version``; one host's worker SIGKILLed
during writes from two hosts loses nothing acknowledged (the message it held
is delivered again, within the visibility timeout, to another host's worker)
and the store opens; the same queries answer the same on every host (ids,
ranks, scores) and through the broker.
"""

from __future__ import annotations

import os
import re
import statistics
import time
import uuid

import pytest

from tests.hosts import (
    HOSTS,
    NAMESPACE,
    QUERIES,
    Agent,
    bursts,
    kill_round,
    skip_unless_hosts,
    store_kwargs,
    three_hosts,
)

# one worker of xdist runs them all, in order, on one set of hosts (``--dist loadgroup``)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("three-hosts")]

@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    skip_unless_hosts()
    with three_hosts(tmp_path_factory.mktemp("hosts")) as h:
        yield h


def test_writes_from_two_hosts_at_once_are_all_present_once(hosts):
    t0 = time.perf_counter()
    acked, failed = bursts(hosts, 8, "two")
    took = sorted(a["acked"] - a["sent"] for a in acked.values())
    assert not failed, f"writes refused: {list(failed.values())[:3]}"
    assert len(acked) == 16
    ids, _ = hosts.lake_ids()
    missing = sorted(set(acked) - set(ids))
    twice = sorted(i for i, n in ids.items() if n > 1)
    assert not missing, f"acknowledged writes missing from the lake: {missing}"
    assert not twice, f"memories present more than once: {twice}"
    print(f"\n16 one-memory writes from two hosts at once in {time.perf_counter() - t0:.1f} s, each present once; "
          f"sent -> acknowledged p50 {statistics.median(took) * 1000:.0f} ms, max {took[-1] * 1000:.0f} ms; "
          f"the ingest worker's own time p50: " + ", ".join(
              f"{k} {statistics.median(a['seconds'].get(k, 0.0) for a in acked.values()) * 1000:.0f} ms"
              for k in sorted({k for a in acked.values() for k in a["seconds"]})))


def test_each_acknowledged_write_is_answered_on_every_host_within_the_bound(hosts):
    delays: dict[int, list[float]] = {i: [] for i in HOSTS}
    alone: list[float] = []  # a write's own time, sent -> acknowledged, no other write at the same time
    for k in range(5):
        writer = hosts.writers[1 + k % 2]
        marker = "zq" + uuid.uuid4().hex[:10].translate(str.maketrans("0123456789", "ghijklmnop"))
        mid = f"visible-{k}"
        for i in HOSTS:
            hosts.probes[i].send("watch", id=mid, text=marker, namespace=NAMESPACE, within=30.0)
        done = writer.ask("remember", records=[{"id": mid, "namespace": NAMESPACE, "content": f"{marker} visible"}])
        for i in HOSTS:
            seen = hosts.probes[i].reply(timeout=60)
            assert seen["seen"] is not None, f"host {i} never answered {mid} (written at snapshot {done['version']})"
            delays[i].append(seen["seen"] - done["acked"])
        alone.append(done["acked"] - done["sent"])
    # with min_version: answered at the first search, however recently the host polled
    reach: dict[int, list[float]] = {i: [] for i in HOSTS}
    plain: dict[int, list[float]] = {i: [] for i in HOSTS}  # the same search again, the state already current
    for k in range(3):
        writer = hosts.writers[1 + k % 2]
        marker = "zq" + uuid.uuid4().hex[:10].translate(str.maketrans("0123456789", "ghijklmnop"))
        mid = f"reach-{k}"
        done = writer.ask("remember", records=[{"id": mid, "namespace": NAMESPACE, "content": f"{marker} reached"}])
        for i in HOSTS:
            got = hosts.probes[i].ask("reach", id=mid, text=marker, version=done["version"], namespace=NAMESPACE)
            assert got["found"], f"host {i}: a search with min_version={done['version']} did not answer {mid}"
            assert got["store_version"] >= done["version"]
            reach[i].append(got["seconds"])
            plain[i].append(got["plain_seconds"])
    every = [d for ds in delays.values() for d in ds]
    print("\nwrite acknowledged -> answered by a search (no min_version), per host, p50 / max over 5 writes: "
          + "; ".join(f"host {i} {statistics.median(ds) * 1000:.0f} / {max(ds) * 1000:.0f} ms"
                      for i, ds in delays.items())
          + f"; all: p50 {statistics.median(every) * 1000:.0f} ms (load {os.getloadavg()[0]:.1f}); "
          f"these writes, one at a time, sent -> acknowledged p50 {statistics.median(alone) * 1000:.0f} ms")
    print("one search with min_version=v right after the write, per host, p50 / max over 3 writes: "
          + "; ".join(f"host {i} {statistics.median(s) * 1000:.0f} / {max(s) * 1000:.0f} ms" for i, s in reach.items())
          + "; the same search again: "
          + "; ".join(f"host {i} {statistics.median(s) * 1000:.0f} ms" for i, s in plain.items()))
    # the goal is 1 s p50 on a quiet machine; a shared one (load 15 on 2 cores) saw 1.6 s, hence the room
    assert statistics.median(every) < 3.0, f"write-to-visible p50 {statistics.median(every):.2f} s"
    assert max(every) < 15.0, f"a write took {max(every):.2f} s to be answered"


def test_one_hosts_worker_killed_during_writes_loses_nothing_acknowledged(hosts):
    got = kill_round(hosts, 1, "kill", 8)
    acked, failed, killed = got["acked"], got["failed"], set(got["held"])
    # the message the killed worker held ran on another host's worker (delivered again); its
    # result is stored before its "succeeded" line is logged, so the logs are read within a bound
    deadline = time.monotonic() + 30
    while True:
        others = hosts.log(2) + hosts.log(3)
        rerun = {t for t in killed if re.search(rf"ingest\.remember\[{t}\] succeeded", others)}
        if rerun == killed or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if got["killed"]:
        hosts.start_worker(1)  # the host comes back and follows the lake
    assert got["killed"], "host 1's worker held no write to kill it with"
    assert killed, "the write host 1's worker held finished before the kill landed (rare): run again"
    assert not failed, f"writes failed after the kill: {list(failed.values())[:3]}"
    ids, latest = hosts.lake_ids()  # the store opens, from a process that was not there
    assert not sorted(set(acked) - set(ids)), "acknowledged writes lost"
    assert not [i for i, n in ids.items() if n > 1], "a memory present twice"
    replayed = sum(1 for a in acked.values() if a["replayed"])
    print(f"\nhost 1's worker SIGKILLed holding {len(killed)} write(s) during 16 writes from hosts 1 and 2 "
          f"({got['seconds']:.1f} s): {len(acked)} acknowledged, all present once; {len(rerun)} of the held ones run "
          f"again on host 2 or 3, {replayed} answered as a replay; latest snapshot {latest}")
    assert rerun == killed, f"held by the killed worker, never run elsewhere: {killed - rerun}"


def test_the_kills_bench_on_these_hosts_counts_what_it_checks(hosts):
    """``ops.bench.host_kills`` (issue 34's 40 kills on three hosts), two
    kills here (hosts 1 and 2 in turn): each counted kill caught a worker
    holding a write, the worker came back, nothing acknowledged was lost, the
    hosts answer alike, and a write alone is split into its parts."""
    from ops.bench.host_kills import measure

    row = measure(hosts, kills=2, burst=4, n_alone=3, log=print)
    assert row["kills"] == 2 and row["rounds"] >= 2
    assert row["lost"] == 0 and row["present_twice"] == 0 and row["queries_differing"] == 0, row
    assert row["failed"] == 0, row["failed_examples"]
    assert row["acknowledged"] >= 2 * 2 * 4
    quiet = row["alone"]
    assert quiet["writes"] == 3 and quiet["sent_to_acked_ms"] > 0 and quiet["embed_ms"] > 0
    assert quiet["store_write_ms"] > 0 and quiet["broker_and_dispatch_ms"] > 0
    for i in HOSTS:  # every host's worker is up again: each takes part in a burst
        assert hosts.stacks[i].procs.get(hosts.worker(i)) is not None
    print(f"\n{row}")


def test_the_same_query_gives_the_same_results_on_every_host(hosts):
    import workers
    from workers.api import search
    from workers.settings import WorkerSettings

    _, latest = hosts.lake_ids()
    answers = {i: hosts.probes[i].ask("queries", queries=QUERIES, min_version=latest, namespace=NAMESPACE)["answers"]
               for i in HOSTS}
    for q, a1, a2, a3 in zip(QUERIES, answers[1], answers[2], answers[3]):
        assert a1["hits"], f"{q} answered nothing"
        assert a1["hits"] == a2["hits"] == a3["hits"], f"{q}: hosts differ:\n{a1}\n{a2}\n{a3}"
    # A host joining now has no base: it builds one at the latest snapshot,
    # while the others read the base of the seed's snapshot and every write
    # since as deltas; base + deltas answers as the newer base does.
    (hosts.tmp / "late").mkdir()
    late = Agent("probe", hosts.net.wrap(3), {**hosts.env(3, broker=False),
                                              "DIMPLE_DATA_DIR": str(hosts.tmp / "late" / "data")},
                 hosts.tmp / "late" / "probe.log")
    try:
        assert late.reply()["ready"]
        later = late.ask("queries", queries=QUERIES, min_version=latest, namespace=NAMESPACE)["answers"]
    finally:
        late.close()
    bases = {p.parts[-4]: p.name for p in hosts.tmp.glob("*/data/indexes/base-*.duckdb")}
    assert bases["late"] == f"base-{latest}.duckdb" and bases["host1"] != bases["late"], bases
    for q, a1, a4 in zip(QUERIES, answers[1], later):
        assert a4["hits"] == a1["hits"], f"{q}: a host with a base at {latest} answers otherwise:\n{a1}\n{a4}"
    workers.configure(WorkerSettings(**store_kwargs(hosts), broker_url=hosts.broker_url,
                                     broker_password=hosts.broker_password))
    try:
        for _ in range(2):  # through the broker: whichever host's workers take each stage
            for q, a in zip(QUERIES, answers[1]):
                got = search(q["text"], mode=q["mode"], namespace=NAMESPACE, top_k=10, min_version=latest)
                assert [[r.id, r.rank, r.score] for r in got.results] == a["hits"], f"{q} through the broker differs"
    finally:
        workers.configure(WorkerSettings(**store_kwargs(hosts)))
    print(f"\n{len(QUERIES)} queries (keyword, semantic, hybrid) at snapshot {latest}: the same ids, ranks and scores "
          f"on the three hosts, on a host that joined last (bases {bases}) and twice through the broker")
