"""The host cache's turns (``pipeline.store.hostcache.HostCache._turn``):
processes that need a missing part at once read it from the base once; the
others wait for it and map what the first wrote. A process that waited
``BUILD_WAIT_S`` in vain reads its own copy, and still answers."""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.store import hostcache
from pipeline.store.hostcache import HostCache

ROOT = Path(__file__).resolve().parents[2]

_WRITER = """
import sys, time
from pathlib import Path
import numpy as np
from pipeline.store.hostcache import HostCache
folder, source, started = sys.argv[1:4]
def slow():
    Path(started).touch()
    time.sleep(1.5)
    return {"emb": np.arange(12, dtype=np.float32).reshape(3, 4)}, {"ids": ["a", "b", "c"]}
cache = HostCache(Path(folder), Path(source))
cache.part("vector", slow)
assert cache.read == ["vector"] and cache.written == ["vector"], (cache.read, cache.written)
"""


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "base-7.duckdb"
    source.write_bytes(b"a base file")
    return source


def test_a_process_that_finds_a_part_being_written_waits_and_maps_it(tmp_path):
    source, folder, started = _source(tmp_path), tmp_path / "cache" / "base-7", tmp_path / "started"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(folder), str(source), str(started)],
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists():
        assert writer.poll() is None, writer.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.02)

    def never():
        raise AssertionError("read from the base while another process was writing the part")

    cache = HostCache(folder, source)
    arrays, lists = cache.part("vector", never)  # the writer holds the turn: this waits for it
    _, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert cache.read == [] and cache.written == []
    assert isinstance(arrays["emb"], np.memmap) or isinstance(arrays["emb"].base, np.memmap)
    assert arrays["emb"].tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()
    assert lists == {"ids": ["a", "b", "c"]}


def test_a_process_that_waited_its_bound_in_vain_reads_its_own_copy(tmp_path, monkeypatch, caplog):
    source, folder = _source(tmp_path), tmp_path / "cache" / "base-7"
    folder.mkdir(parents=True)
    monkeypatch.setattr(hostcache, "BUILD_WAIT_S", 0.3)
    held = os.open(folder / "vector.lock", os.O_CREAT | os.O_RDWR, 0o600)  # another open file: another holder
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        cache = HostCache(folder, source)
        t = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="dimple.hostcache"):
            arrays, lists = cache.part("vector", lambda: ({"emb": np.ones((2, 2), np.float32)}, {"ids": ["x", "y"]}))
        assert time.monotonic() - t >= 0.3
        assert cache.read == ["vector"]
        assert arrays["emb"].tolist() == [[1.0, 1.0], [1.0, 1.0]] and lists == {"ids": ["x", "y"]}
        assert "still being written by another process" in caplog.text
    finally:
        os.close(held)
