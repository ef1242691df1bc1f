"""Compaction of the lake (docs/LAKE.md, "Derived
indexes" and "Forget means erased"): a base built by one process is found
through the catalog and loaded by another, which answers as before;
compactions at once build one base; a forget is hidden at once and its bytes
are erased by the compaction that finds it due (``store.erase_within``), not
before; a write that passes a threshold, and an ingest process's periodic
check, start a compaction; bad settings are refused naming the field. Real
DuckDB files and a SQLite catalog; the default ``store.erase_within`` (a
forget is made due by its own time, not by a shorter setting)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from pipeline.errors import InputError, StoreError
from pipeline.settings import Settings
from pipeline.store.database import utcnow
from pipeline.store.lake import Lake
from pipeline.store.lake import erase as erasing
from pipeline.store.lake.commit import retrying
from tests.conftest import store_settings
from tests.lakes import age_forgets, files_holding, pass_the_wait

ROOT = Path(__file__).resolve().parents[2]
SECRET = "ZQX vault code 7341"


@pytest.fixture
def settings(tmp_path):
    settings = store_settings(tmp_path)
    settings.audit_enabled = False  # the audit log (query text, previews) is not the lake's yet
    return settings


def _env(settings) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DIMPLE_DATA_DIR": str(settings.data_dir),
            "DIMPLE_EMBEDDING_MODEL": "hash-64", "DIMPLE_AUDIT_ENABLED": "false"}


def _listed(settings) -> dict[int, str]:
    with Lake.open(settings) as lake:
        return {int(s): p for s, p in lake.con.execute("SELECT DISTINCT snapshot, path FROM indexes").fetchall()}




QUERIES = ["deploy window friday", "cache latency", "quokka car park", "schema migration", "note 7"]


def _answers() -> dict:
    from workers.api import search

    out = {}
    for text in QUERIES:
        for mode in ("keyword", "semantic", "hybrid"):
            got = search(text, mode=mode, top_k=10, now="2026-01-01T00:00:00").results
            out[text, mode] = ([r.id for r in got], [r.score for r in got])
    return out


def _remember_some() -> None:
    from workers.api import forget, remember

    topics = ["deploy window friday", "cache latency spike", "schema migration plan", "car park quokka"]
    remember([{"id": f"m{i}", "namespace": f"ns{i % 2}", "content": f"note {i} about the {topics[i % 4]}"}
              for i in range(24)])  # the first write: the first base
    remember([{"id": f"late{i}", "namespace": "ns0", "content": f"late note {i}: the {topics[i % 4]} again"}
              for i in range(3)])
    forget(["m5", "m6"])


# -- a base one process builds, another loads ----------------------------------------------------
def test_a_compaction_in_another_process_builds_a_base_this_one_loads_and_answers_the_same(embedded, tmp_path):
    from workers import resources

    _remember_some()
    reader = resources.current().reader()
    before_base = reader.snapshot().base
    before = _answers()
    assert sum(len(ids) for ids, _ in before.values()) > 40, "the comparison must not pass on empty answers"

    # `dimple compact` in another process: the CLI on the lake
    done = subprocess.run([sys.executable, "-m", "workers.cli", "compact"], cwd=tmp_path, env=_env(embedded),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "compacted the lake" in done.stdout and "holds 25 memories" in done.stdout
    newest = max(_listed(embedded))

    reader.wait_ready()  # this process saw the new base at its next poll and loaded it in the background
    snap = reader.snapshot()
    assert snap.base != before_base and snap.base.endswith(f"base-{newest}.duckdb") and snap.overlay.empty
    after = _answers()
    assert after.keys() == before.keys()
    for key in before:
        assert after[key][0] == before[key][0], key
        assert np.allclose(after[key][1], before[key][1], rtol=1e-9), key
    # nothing written since: a second compaction builds nothing
    again = subprocess.run([sys.executable, "-m", "workers.cli", "compact"], cwd=tmp_path, env=_env(embedded),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "nothing to compact" in again.stdout
    assert max(_listed(embedded)) == newest


def test_a_base_that_failed_to_load_in_the_background_is_tried_again(embedded, monkeypatch, caplog):
    """A new base's background load that fails (a moment's I/O error, memory)
    is tried again after a pause (``LOAD_RETRY_S``, doubled at each failure),
    not left until another base is listed: meanwhile the old base answers,
    merging every snapshot since it."""
    import logging
    import time

    from pipeline.store.lake import follow
    from pipeline.store.lake.compaction import compact_lake
    from workers import resources

    _remember_some()
    reader = resources.current().reader()
    old, before = reader.snapshot().base, _answers()
    failures, opened = [], follow.Snapshot.open

    def fails_once(*args, **kwargs):
        if threading.current_thread().name == "dimple-lake-base-load" and not failures:
            failures.append(1)
            raise OSError("Input/output error")
        return opened(*args, **kwargs)

    monkeypatch.setattr(follow.Snapshot, "open", fails_once)
    caplog.set_level(logging.WARNING, logger="dimple.lake")
    assert compact_lake(embedded, rebuild=True).ran  # another process's compaction, as far as this reader knows
    newest = max(_listed(embedded))
    reader.snapshot(fresh=True)  # sees the listing: the load starts, and fails
    reader.wait_ready()
    assert failures and "tried again in 5 s" in caplog.text
    assert reader.snapshot(fresh=True).base == old
    deadline = time.monotonic() + follow.LOAD_RETRY_S + 30
    while not reader.snapshot(fresh=True).base.endswith(f"base-{newest}.duckdb"):
        assert time.monotonic() < deadline, "the base that failed to load was never tried again"
        reader.wait_ready(1)
        time.sleep(0.2)
    assert {k: ids for k, (ids, _) in _answers().items()} == {k: ids for k, (ids, _) in before.items()}


_COMPACTOR = """
import json, sys, time
from pathlib import Path
from pipeline.settings import Settings
from pipeline.store.lake.compaction import compact_lake
from pipeline.store.lake.follow import Follower
settings = Settings()
follower = Follower(settings)
follower.lake()  # attached: both start together
Path(sys.argv[1] + "." + sys.argv[2]).touch()
while not Path(sys.argv[1]).exists():
    time.sleep(0.005)
report = compact_lake(settings, wait=True, follower=follower)
print(json.dumps(report.as_dict()))
"""


def test_two_compactions_at_once_build_one_base(embedded, tmp_path):
    from workers.api import remember

    remember([{"id": f"m{i}", "namespace": "n", "content": f"note {i}"} for i in range(6)])
    remember({"id": "x", "namespace": "n", "content": "one more note"})
    first = set(_listed(embedded))
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _COMPACTOR, str(go), name], cwd=tmp_path, env=_env(embedded),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    deadline = time.monotonic() + 120
    while not all(Path(f"{go}.{n}").exists() for n in "ab") and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["ran"] for r in reports) == [False, True]  # one built; the other waited, then found it done
    built = set(_listed(embedded)) - first
    assert len(built) == 1 and [r["base"] for r in reports if r["ran"]] == [f"base-{built.pop()}.duckdb"]


def test_the_claim_of_compaction_head_is_renewed_and_taken_over_only_from_the_dead(embedded):
    import socket

    from pipeline.store.lake import compaction
    from workers.api import remember

    remember({"id": "a", "namespace": "n", "content": "alpha"})
    here = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with Lake.open(embedded) as lake:
        def hold(holder: str, age: timedelta) -> None:
            lake.con.execute("UPDATE compaction_head SET holder = ?, claimed_at = ?", [holder, utcnow() - age])

        def held_at():
            return lake.con.execute("SELECT holder, claimed_at FROM compaction_head").fetchone()

        hold("elsewhere:1:aa", compaction.LEASE - timedelta(seconds=30))  # another host, renewed lately
        assert not compaction.claim(lake, "me:1:bb")
        hold("elsewhere:1:aa", compaction.LEASE + timedelta(seconds=30))  # another host, silent past the lease
        assert compaction.claim(lake, "me:1:bb") and held_at()[0] == "me:1:bb"
        hold(f"{here}:{os.getpid()}:cc", timedelta(0))  # this host, a live process
        assert not compaction.claim(lake, "me:1:bb")
        hold(f"{here}:{int(dead.stdout)}:dd", timedelta(0))  # this host, a process that is gone
        assert compaction.claim(lake, "me:1:bb") and held_at()[0] == "me:1:bb"
        # each takeover recorded: what the dead left may hold bytes an erase must remove (erase.cut)
        assert sorted(r[0] for r in lake.con.execute("SELECT holder FROM dead_compactions").fetchall()) == \
            sorted(["elsewhere:1:aa", f"{here}:{int(dead.stdout)}:dd"])

        hold("me:1:bb", compaction.LEASE - timedelta(seconds=10))
        before = held_at()[1]
        beat = compaction._Heartbeat(lake, "me:1:bb")
        try:
            assert beat.renew() and held_at()[1] > before + timedelta(seconds=10)  # renewed: another LEASE
            hold("elsewhere:2:ee", timedelta(0))
            assert not beat.renew() and held_at()[0] == "elsewhere:2:ee"  # taken over: not renewed back
        finally:
            beat.cur.close()


def test_a_compaction_whose_claim_was_taken_over_stops_before_its_next_step(embedded, monkeypatch):
    """Its taker recorded it dead when it took the claim over: files it wrote
    after that would escape an erase's wait for what the dead left, so a
    compaction that finds its claim gone goes no further."""
    from pipeline.store.lake import compaction
    from workers.api import remember

    remember({"id": "a", "namespace": "n", "content": "alpha"})
    monkeypatch.setattr(compaction, "HEARTBEAT", timedelta(seconds=0.05))
    with Lake.open(embedded) as lake:
        assert compaction.claim(lake, "me:1:bb")
        with compaction._Heartbeat(lake, "me:1:bb") as beat:
            time.sleep(0.3)  # renewed several times
            beat.holding("a step")  # still its own: goes on

            def take_over() -> None:  # as another host's claim would: retried past the heartbeat's commits
                lake.con.execute("BEGIN TRANSACTION")
                lake.con.execute("UPDATE compaction_head SET holder = 'elsewhere:2:ee'")
                lake.con.execute("COMMIT")

            retrying(lake.con, take_over, deadline_s=30, what="taking the claim over")
            deadline = time.monotonic() + 30
            while not beat.lost.is_set():
                assert time.monotonic() < deadline, "the heartbeat never found its claim gone"
                time.sleep(0.02)
            with pytest.raises(StoreError, match="taken over.*stopped before the erase's cut"):
                beat.holding("the erase's cut")


# -- forget means erased, within store.erase_within ---------------------------------------------
def _remember_secret():
    from workers.api import remember

    # one small write (inlined in the catalog), one large (a Parquet file of its own)
    remember([{"id": "s1", "namespace": "n", "content": SECRET, "context": f"{SECRET} again"},
              {"id": "k1", "namespace": "n", "content": "keep me"}])
    remember([{"id": f"bulk{i}", "namespace": "n", "content": f"bulk note {i}"} for i in range(15)]
             + [{"id": "s2", "namespace": "n", "content": f"{SECRET} in bulk", "metadata": {"note": SECRET}}])
    return remember({"id": "k2", "namespace": "n", "content": "written before the forget"})


def _ids(query: str, **options) -> list[str]:
    from workers.api import search

    return sorted(r.id for r in search(query, mode="keyword", **options).results)


def test_a_forget_not_yet_due_is_hidden_at_once_and_erased_only_when_due(embedded):
    from workers import resources
    from workers.api import forget
    from workers.app import get_app
    from workers.upkeep import check

    before = _remember_secret()
    assert _ids("vault code") == ["s1", "s2"]
    forget(["s1", "s2"])
    assert _ids("vault code") == []  # hidden at once
    folders = (embedded.data_dir, embedded.lake_data_path, embedded.lake_index_path)

    # a compaction before the forget is due: files merged, a new base, the history kept
    from pipeline.store.maintenance import compact

    report = compact(embedded, wait=True)
    assert report.ran and report.forgotten == 0
    assert files_holding(SECRET.encode(), *folders), "not due: its bytes stay for time travel"
    with Lake.open(embedded) as lake:  # the snapshots before the forget still read it (as_of leaves it out)
        assert {m.id for m in lake.read(at=before.version, ids=["s1", "s2"])} == {"s1", "s2"}
    assert "bulk3" in _ids("bulk note 3", as_of=before.version)
    assert not check(get_app())  # the periodic check finds nothing due

    # the same forget once it is as old as store.erase_within (the default)
    assert embedded.store.erase_within == timedelta(hours=1)
    age_forgets(embedded, timedelta(hours=1))
    assert check(get_app())  # the ingest process's periodic check: compacts (here, in this process)
    if pass_the_wait(embedded):  # a DuckLake crash left files its erase waited for: the next check
        assert check(get_app())
    assert files_holding(SECRET.encode(), *folders) == []
    assert files_holding(b"vault code", *folders) == []
    with pytest.raises(InputError, match="^as_of: "):
        _ids("bulk note 3", as_of=before.version)  # history before the erase is cut
    # this process's reader had a base whose snapshot expired: it loads the current one
    reader = resources.current().reader()
    reader.wait_ready()
    newest = max(_listed(embedded))
    assert reader.snapshot(fresh=True).base.endswith(f"base-{newest}.duckdb")
    assert list(_listed(embedded)) == [newest]  # the older bases (they held the text) are gone
    from workers.api import get

    assert [m["id"] for m in get(["k1", "s1", "s2", "bulk3"])] == ["k1", "bulk3"]
    assert "bulk3" in _ids("bulk note 3")
    assert not check(get_app())  # erased: nothing due any more


def test_the_check_warns_when_a_forget_waits_past_the_bound(embedded, caplog, monkeypatch):
    """A forget still waiting once older than ``store.erase_within`` means the
    promise is broken (compactions failing, or an erase waiting for files the
    dead left): the ingest process's periodic check says so at WARNING, once
    per ``OVERDUE_EVERY``, and says nothing while the bound holds."""
    from workers import upkeep
    from workers.api import forget, remember
    from workers.app import get_app

    monkeypatch.setattr(upkeep, "_overdue_said", [float("-inf")])
    remember([{"id": "a", "namespace": "n", "content": "alpha"}, {"id": "b", "namespace": "n", "content": "beta"}])
    forget(["a"])
    age_forgets(embedded, timedelta(minutes=55))  # due (at 54 min), within the bound
    with caplog.at_level(logging.WARNING, logger="dimple.worker"):
        assert upkeep.check(get_app())  # erased, here
        if pass_the_wait(embedded):  # a DuckLake crash left files its erase waited for: the next check
            assert upkeep.check(get_app())
        assert not [r for r in caplog.records if "erase_within broken" in r.getMessage()]

        forget(["b"])
        age_forgets(embedded, timedelta(hours=2))
        with Lake.open(embedded) as lake:  # a compaction that runs long holds the claim: nothing erases it
            lake.con.execute("UPDATE compaction_head SET holder = ?, claimed_at = ?",
                             [f"{socket.gethostname()}:{os.getpid()}:busy", utcnow()])
        assert upkeep.check(get_app()) and upkeep.check(get_app())
        said = [r.getMessage() for r in caplog.records if "erase_within broken" in r.getMessage()]
    assert len(said) == 1, said  # once, not at every check
    assert "1 forget(s) wait to be erased, the oldest for 2:00:" in said[0] and "(the bound is 1:00:00)" in said[0]
    assert "have not (see their errors)" in said[0]


def test_the_overdue_warning_says_whether_the_wait_for_the_dead_is_still_on(caplog, monkeypatch):
    """Held for files the dead left, the warning gives the wait's end; once that
    has passed with the forget still waiting, it says the wait is over and the
    compactions since failed (not that the erase still waits)."""
    from workers import upkeep

    now = utcnow()
    for held_until, says in ((now + timedelta(minutes=20), "the erase waits for files"),
                             (now - timedelta(minutes=20), "ended at")):
        monkeypatch.setattr(upkeep, "_overdue_said", [float("-inf")])
        state = erasing.EraseState(oldest=now - timedelta(hours=2), waiting=1, held_until=held_until)
        with caplog.at_level(logging.WARNING, logger="dimple.worker"):
            upkeep._overdue(state, timedelta(hours=2), now, timedelta(hours=1))
        said = caplog.records[-1].getMessage()
        assert says in said and f"{held_until:%Y-%m-%d %H:%M:%S} UTC" in said, said


def test_a_check_that_fails_on_a_store_error_logs_its_message_not_a_traceback(caplog, monkeypatch):
    """An erase that cannot complete fails every minute with what the operator
    must do (``erase._still_there``): one ERROR line each time, not a stack trace."""
    from pipeline.errors import StoreError
    from workers import upkeep

    calls = threading.Event()

    def check(app, here=False):
        calls.set()
        raise StoreError("erase: 1 file(s) ... delete them by hand and run `dimple compact`")

    monkeypatch.setattr(upkeep, "check", check)
    monkeypatch.setattr(erasing, "check_every", lambda erase_within: timedelta(seconds=0.01))
    runner = upkeep._Upkeep()
    with caplog.at_level(logging.ERROR, logger="dimple.worker"):
        runner.start(None)  # type: ignore[arg-type]
        assert calls.wait(10)
        runner.end()
    failed = [r for r in caplog.records if "erase check failed" in r.getMessage()]
    assert failed and all(r.exc_info is None for r in failed)
    assert "delete them by hand" in failed[0].getMessage()


_ERASE_FOLLOWER = """
import json, sys, time
from pathlib import Path
from pipeline.settings import Settings
from pipeline.store.lake import follow
built = []
real = follow.build_base
def counted(lake, snapshot, path, settings):
    built.append(snapshot)
    return real(lake, snapshot, path, settings)
follow.build_base = counted
flags = Path(sys.argv[1])
def wait(name):
    deadline = time.monotonic() + 240
    while not (flags / name).exists():
        assert time.monotonic() < deadline, name
        time.sleep(0.01)
reader = follow.reader_for(Settings())
first = reader.snapshot(fresh=True).base
(flags / "following").touch()
wait("building")  # the compaction is building its base: this process follows meanwhile
during = reader.snapshot(fresh=True).version
(flags / "polled").touch()
wait("done")
reader.wait_ready()
after = reader.snapshot(fresh=True)
print(json.dumps({"built": built, "first": first, "during": during, "base": after.base, "version": after.version}))
reader.close()
"""


_PAUSING_COMPACTOR = """
import json, sys, time
from pathlib import Path
from pipeline.settings import Settings
from pipeline.store.lake.compaction import compact_lake
from pipeline.store.lake.follow import Follower
flags = Path(sys.argv[1])
class Pausing(Follower):
    def build(self, snapshot):  # at its base build, the other process follows the lake once
        (flags / "building").touch()
        deadline = time.monotonic() + 240
        while not (flags / "polled").exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return super().build(snapshot)
settings = Settings()
follower = Pausing(settings)
report = compact_lake(settings, wait=True, follower=follower)
follower.close()
(flags / "done").touch()
print(json.dumps(report.as_dict()))
"""


def test_a_reader_following_across_an_erase_loads_the_listed_base_and_builds_none(embedded, tmp_path):
    from workers import resources, upkeep
    from workers.api import forget

    _remember_secret()
    forget(["s1", "s2"])
    upkeep.stop()  # this process's own check (started by a write) would compact the due erase itself
    resources.current().close_store()
    age_forgets(embedded, timedelta(hours=1))  # an erase is due
    flags = tmp_path / "flags"
    flags.mkdir()
    procs = {}
    try:
        procs["follower"] = subprocess.Popen([sys.executable, "-c", _ERASE_FOLLOWER, str(flags)], cwd=tmp_path,
                                             env=_env(embedded), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True)
        deadline = time.monotonic() + 240
        while not (flags / "following").exists():
            assert procs["follower"].poll() is None and time.monotonic() < deadline, procs["follower"].stderr.read()
            time.sleep(0.01)
        procs["compactor"] = subprocess.Popen([sys.executable, "-c", _PAUSING_COMPACTOR, str(flags)], cwd=tmp_path,
                                              env=_env(embedded), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True)
        outs = {"compactor": procs["compactor"].communicate(timeout=300)}
        assert procs["compactor"].returncode == 0, outs["compactor"][1]
        outs["follower"] = procs["follower"].communicate(timeout=300)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for name, proc in procs.items():
        assert proc.returncode == 0, (name, outs[name][1])
    seen = json.loads(outs["follower"][0].strip().splitlines()[-1])
    report = json.loads(outs["compactor"][0].strip().splitlines()[-1])
    assert report["ran"] and report["forgotten"] == 1  # one forget write, erased
    newest = max(_listed(embedded))
    assert seen["built"] == [], "the reader built a base of its own: the erase expired its base before listing one"
    assert seen["first"] != seen["base"] and seen["base"].endswith(f"base-{newest}.duckdb")
    assert report["base"] == f"base-{newest}.duckdb" and list(_listed(embedded)) == [newest]
    folders = (embedded.data_dir, embedded.lake_data_path, embedded.lake_index_path)
    assert files_holding(SECRET.encode(), *folders) == []  # the erase still erased


def test_a_write_passing_the_threshold_compacts_the_lake(embedded, monkeypatch):
    from pipeline.store.lake import follow
    from workers.api import remember

    # a new base loads in the background while the old one answers: here it waits until the
    # test lets it go (at 10,000 memories it takes seconds, over several writes)
    go, opened = threading.Event(), follow.Snapshot.open

    def slow_open(*args, **kwargs):
        if threading.current_thread().name == "dimple-lake-base-load":
            go.wait(60)
        return opened(*args, **kwargs)

    monkeypatch.setattr(follow.Snapshot, "open", slow_open)
    embedded.compact_max_deltas = 2  # snapshots over the base
    remember({"id": "a", "namespace": "n", "content": "alpha"})  # the first base
    assert not remember({"id": "b", "namespace": "n", "content": "beta"}).compact_due
    first = set(_listed(embedded))
    due = remember({"id": "c", "namespace": "n", "content": "gamma"})
    assert due.compact_due  # and ingest.compact ran (eagerly, here)
    assert len(set(_listed(embedded)) - first) == 1
    assert _ids("gamma") == ["c"]
    # the next write is one snapshot over the new base, whichever base this process reads
    # while it loads that one: no second compaction of what the first just compacted
    assert not remember({"id": "d", "namespace": "n", "content": "delta"}).compact_due
    assert len(set(_listed(embedded)) - first) == 1
    go.set()
    assert remember({"id": "e", "namespace": "n", "content": "epsilon"}).compact_due  # two over it: due
    assert _ids("delta") == ["d"] and _ids("epsilon") == ["e"]


def test_a_burst_of_writes_past_the_threshold_compacts_once(embedded, monkeypatch):
    """Every write of a burst past the threshold sends ``ingest.compact``; the
    first to run compacts, and those queued behind it find nothing due and
    build nothing (each was a whole base built again, and a process started,
    for the writes between them)."""
    from pipeline.store import maintenance
    from workers import tasks
    from workers.api import remember

    embedded.compact_max_deltas = 3
    remember({"id": "a", "namespace": "n", "content": "alpha"})  # the first base
    sent: list[dict] = []
    from workers.app import get_app

    monkeypatch.setattr(get_app().tasks["ingest.compact"], "apply_async",
                        lambda *a, **kw: sent.append(kw.get("kwargs", {})))  # held: the burst's messages
    for i, word in enumerate(["beta", "gamma", "delta", "epsilon"]):
        remember({"id": f"w{i}", "namespace": "n", "content": word})
    assert sent == [{"when_due": True}] * 2  # the third and fourth writes found it due
    built: list[bool] = []
    real = maintenance.compact

    def counted(*args, **kwargs):
        built.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(tasks, "compact", counted)
    first = tasks.compact_task(**sent[0])
    assert first["ran"] and first["memories"] == 5
    assert tasks.compact_task(**sent[1]) == {**first, "version": 0, "base": None, "memories": 0, "seconds": 0.0,
                                             "ran": False, "removed": []}
    assert built == [True]  # the second message started no compaction
    assert tasks.compact_task()["ran"] is False  # dimple compact's own: nothing written since, nothing built
    assert _ids("epsilon") == ["w3"]


def test_the_erase_rule_at_the_default_bound():
    within = Settings(_env_file=None).store.erase_within
    now = utcnow()
    assert within == timedelta(hours=1) and erasing.check_every(within) == timedelta(minutes=1)
    assert not erasing.due(None, within, now)
    assert not erasing.due(now - timedelta(minutes=53), within, now)
    # due with room for the next check and a compaction inside the hour
    assert erasing.due(now - timedelta(minutes=54), within, now)


# -- settings -------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "-60", "30", "soon"])
def test_a_bad_erase_within_is_refused_naming_the_field(monkeypatch, value):
    monkeypatch.setenv("DIMPLE_STORE__ERASE_WITHIN", value)
    with pytest.raises(ValidationError) as err:
        Settings(_env_file=None)
    assert [e["loc"] for e in err.value.errors()] == [("store", "erase_within")]


def test_an_index_path_inside_the_data_path_is_refused_naming_the_field_before_anything_is_written(tmp_path):
    from pipeline.store.maintenance import compact
    from pipeline.store.writes import parse_records, write

    settings = store_settings(tmp_path)
    settings.store.index_path = settings.lake_data_path / "indexes"
    with pytest.raises(StoreError, match="^store.index_path: .* inside the lake's data path"):
        write(settings, parse_records({"id": "a", "namespace": "n", "content": "x"}, settings))
    with pytest.raises(StoreError, match="^store.index_path: "):
        compact(settings, wait=True)
    assert not (tmp_path / "data" / "lake.sqlite").exists()  # nothing written
    settings.store.index_path = tmp_path / "elsewhere"
    assert write(settings, parse_records({"id": "a", "namespace": "n", "content": "x"}, settings)).compacted
    assert [p.name for p in (tmp_path / "elsewhere").iterdir()] == [f"base-{max(_listed(settings))}.duckdb"]


def test_compacting_an_empty_lake_does_nothing(tmp_path):
    from pipeline.store.maintenance import compact

    assert not compact(store_settings(tmp_path), wait=True).ran  # an empty lake: nothing to do



def test_a_store_compacted_to_no_memories_finds_what_is_written_after(embedded):
    """Forget everything, compact (a base of no memories), write again: the
    full-text leg searches the writes over that base, as over any other."""
    from pipeline.store.lake.compaction import compact_lake
    from workers import resources
    from workers.api import forget, remember, search

    remember({"id": "a", "namespace": "n", "content": "aardvark notes"})
    forget(["a"])
    assert compact_lake(embedded, wait=True).memories == 0
    resources.current().close_store()  # opened again on the new base, not loading it in the background
    remember({"id": "b", "namespace": "n", "content": "zebra crossing downtown"})
    assert _ids("zebra") == ["b"] and _ids("aardvark") == []
    hybrid = search("zebra crossing", mode="hybrid")
    assert [r.id for r in hybrid.results] == ["b"] and hybrid.legs["fts"]["hits"] == 1
