"""The publication protocol: one writer copies the published store into a new
generation, writes there and publishes it by replacing ``CURRENT`` atomically;
readers switch at their next look and the previous generation survives one
more publish for a reader that looked just before the switch."""

from __future__ import annotations

import multiprocessing

import pytest

from pipeline.errors import StoreError
from pipeline.store import generations as gen


def _write(data_dir, text: str):
    with gen.writing(data_dir) as path:
        old = path.read_text() if path.exists() else ""
        path.write_text(old + text)
    return path


def test_a_generation_is_published_only_when_its_block_succeeds(tmp_path):
    assert gen.current(tmp_path) is None
    first = _write(tmp_path, "a")
    assert gen.current(tmp_path) == first and first.read_text() == "a"
    assert (tmp_path / gen.CURRENT).read_text().strip() == "generations/store-00000001.duckdb"

    with pytest.raises(RuntimeError), gen.writing(tmp_path) as path:
        path.write_text("half-written")
        raise RuntimeError("the writer failed")
    assert not path.exists(), "a failed generation is removed"
    assert gen.current(tmp_path) == first and first.read_text() == "a"


def test_a_new_generation_starts_as_a_copy_of_the_published_one(tmp_path):
    _write(tmp_path, "a")
    second = _write(tmp_path, "b")
    assert second.read_text() == "ab" and gen.current(tmp_path) == second


def test_publishing_keeps_the_previous_generation_and_drops_older_ones(tmp_path):
    paths = [_write(tmp_path, str(i)) for i in range(4)]
    assert [p.name for _, p in gen.generation_files(tmp_path)] == [paths[2].name, paths[3].name]
    assert gen.current(tmp_path) == paths[3]


def test_a_reader_holding_a_dropped_generation_keeps_reading_it(tmp_path):
    first = _write(tmp_path, "old")
    with open(first) as held:  # a reader opened it before the switch
        for i in range(3):
            _write(tmp_path, str(i))
        assert not first.exists()
        assert held.read() == "old"


def _hold_lock(data_dir, ready, release):
    with gen.writer_lock(data_dir):
        ready.set()
        release.wait(30)


def test_one_writer_at_a_time_across_processes(tmp_path):
    ready, release = multiprocessing.Event(), multiprocessing.Event()
    other = multiprocessing.Process(target=_hold_lock, args=(tmp_path, ready, release))
    other.start()
    try:
        assert ready.wait(30)
        with pytest.raises(StoreError, match="another process is writing"), gen.writing(tmp_path):
            pass
    finally:
        release.set()
        other.join(30)
    assert gen.current(tmp_path) is None
    _write(tmp_path, "after")  # the lock is free again
    assert gen.current(tmp_path).read_text() == "after"


def test_a_pointer_to_a_missing_file_reads_as_no_store(tmp_path):
    path = _write(tmp_path, "a")
    path.unlink()
    assert gen.current(tmp_path) is None
