"""A lake write holds no lock between its validation and its commit: what a
write committed in between can invalidate is checked again inside the commit
(``commit._still_valid``). Two writers race on one lake, each with its own
``Reader`` (its own connection): the second commits while the first is
embedding, i.e. after the first validated and before it commits."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from pipeline.embedders import HashEmbedder
from pipeline.errors import IngestValidationError
from pipeline.settings import Settings
from pipeline.store.lake import Lake
from pipeline.store.lake.follow import reader_for
from pipeline.store.writes import get, parse_records, write
from tests.conftest import store_settings


class MidWrite(HashEmbedder):
    """The hash embedder that, at its first call (the write validated, not yet
    committed), runs ``meanwhile`` in another thread and waits for it."""

    def __init__(self, meanwhile: Callable[[], None]):
        super().__init__(64)
        self.meanwhile: Callable[[], None] | None = meanwhile

    def embed(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        if self.meanwhile is not None:
            run, self.meanwhile = self.meanwhile, None
            failed: list[BaseException] = []

            def other() -> None:
                try:
                    run()
                except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
                    failed.append(exc)

            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
            if failed:
                raise failed[0]
        return super().embed(texts, progress)


def _write(settings: Settings, records=None, forget=None, **kw):
    reader = reader_for(settings)
    try:
        return write(settings, parse_records(records, settings) if records else None, forget, reader=reader, **kw)
    finally:
        reader.close()


def _edges(settings: Settings) -> list[tuple]:
    with Lake.open(settings) as lake:
        return sorted(lake.con.execute("SELECT src, dst, kind, origin FROM edges").fetchall())


@pytest.fixture
def lake(tmp_path) -> Settings:
    settings = store_settings(tmp_path)
    _write(settings, [{"id": f"m{i}", "namespace": "n", "content": f"memory number {i}"} for i in range(4)])
    return settings


def test_a_link_to_a_memory_forgotten_between_validation_and_commit_is_refused(lake):
    """Without the check in the commit, the write commits its link to ``m1``
    (forgotten by then) and ``get`` shows it again once ``m1`` is remembered again."""
    embedder = MidWrite(lambda: _write(lake, forget=["m1"]))
    with pytest.raises(IngestValidationError) as err:
        _write(lake, [{"id": "new", "namespace": "n", "content": "replaces the first", "supersedes": ["m1"]}],
               embedder=embedder)
    assert embedder.meanwhile is None  # the forget ran between the validation and the commit
    assert [(e.field, "m1" in e.reason) for e in err.value.errors] == [("supersedes", True)]
    assert get(lake, ["new", "m1"]) == []  # nothing of the write committed; the forget stands
    assert not [e for e in _edges(lake) if "m1" in e[:2]]
    _write(lake, [{"id": "m1", "namespace": "n", "content": "memory number 1, back"}])
    assert get(lake, ["new"]) == [] and not [e for e in _edges(lake) if "m1" in e[:2]]


def test_skip_invalid_leaves_out_only_the_record_whose_link_target_was_forgotten_meanwhile(lake):
    embedder = MidWrite(lambda: _write(lake, forget=["m2"]))
    done = _write(lake, [{"id": "a", "namespace": "n", "content": "supports the second", "supported_by": ["m2"]},
                         {"id": "b", "namespace": "n", "content": "conflicts with the third", "conflicts": ["m3"]}],
                  embedder=embedder, skip_invalid=True)
    assert done.ids == ["b"] and done.inserted == 1 and [s.field for s in done.skipped] == ["supported_by"]
    assert [r["id"] for r in get(lake, ["a", "b", "m2"])] == ["b"]
    assert _edges(lake) == [("b", "m3", "conflicts", "b")]


def test_skip_invalid_reports_every_record_left_out_across_the_writes_attempts(lake):
    """A link target forgotten meanwhile makes the write validate again from a
    newer snapshot; the records its first validation left out stay reported.
    Was: only the second attempt's (the caller never heard of record 3)."""
    embedder = MidWrite(lambda: _write(lake, forget=["m2"]))
    done = _write(lake, [{"id": "a", "namespace": "n", "content": "supports the second", "supported_by": ["m2"]},
                         {"id": "b", "namespace": "n", "content": "conflicts with the third", "conflicts": ["m3"]},
                         {"id": "c", "namespace": "n", "content": "dated oddly", "created_at": 12345}],
                  embedder=embedder, skip_invalid=True)
    assert done.ids == ["b"] and done.inserted == 1
    assert [(s.line, s.field) for s in done.skipped] == [(1, "supported_by"), (3, "created_at")]


def test_a_forget_and_a_replacement_racing_a_write_apply_to_what_is_there(lake):
    """A link to a memory replaced meanwhile stands (it is live); a forget of
    an id another process forgot first counts nothing twice."""
    def meanwhile() -> None:
        _write(lake, [{"id": "m0", "namespace": "n", "content": "memory zero, edited"}])
        _write(lake, forget=["m3"])

    done = _write(lake, [{"id": "c", "namespace": "n", "content": "supersedes zero", "supersedes": ["m0"]}],
                  forget=["m3"], embedder=MidWrite(meanwhile))
    assert done.inserted == 1 and done.forgotten == 0
    (c,) = get(lake, ["c"])
    assert c["supersedes"] == ["m0"] and get(lake, ["m0"])[0]["content"] == "memory zero, edited"
    assert get(lake, ["m3"]) == []
    with Lake.open(lake) as opened:
        forgotten = opened.con.execute("SELECT sum(forgotten) FROM writes").fetchone()[0]
    assert forgotten == 1  # m3 forgotten once, by the other writer


def test_a_processs_writes_and_its_other_threads_read_the_base_without_taking_each_others_rows(tmp_path):
    """One ``Reader`` serves a process's writes and its other threads (an
    ingest process's upkeep thread follows the lake for the store's tuned
    settings; ``get`` and a search read it): each reads the base through a
    cursor of its own. Through the base's one connection, a thread could
    fetch another's rows: a replacement taken for unchanged, a write failing
    on rows of another shape."""
    settings = store_settings(tmp_path)
    n = 300
    _write(settings, [{"id": f"m{i}", "namespace": f"ns{i % 3}", "content": f"base note {i} on the deploy window"}
                      for i in range(n)])  # the first write: the base
    reader = reader_for(settings)
    stop = threading.Event()
    failed: list[BaseException] = []

    def follow() -> None:  # the process's other threads, the lake moving under them
        k = 0
        try:
            while not stop.is_set():
                snap = reader.snapshot(fresh=True)
                assert snap is not None and snap.namespaces() == ["ns0", "ns1", "ns2"]
                got = get(settings, [f"m{k % n}"], reader=reader)
                assert [g["id"] for g in got] == [f"m{k % n}"]
                k += 1
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
            failed.append(exc)

    threads = [threading.Thread(target=follow) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for round_ in range(30):
            ids = [f"m{(round_ * 7 + j) % n}" for j in range(8)]
            records = [{"id": m, "namespace": f"ns{int(m[1:]) % 3}", "content": f"round {round_} note on {m}"}
                       for m in ids[:4]]  # replaced
            records += [{"id": m, "namespace": f"ns{int(m[1:]) % 3}",
                         "content": f"base note {m[1:]} on the deploy window"} for m in ids[4:]]  # as they are
            done = write(settings, parse_records(records, settings), reader=reader)
            assert (done.updated, done.unchanged) == (4, 4), (round_, done)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        reader.close()
    assert not failed, failed[0]
