"""SIGKILL during a write and during a compaction of the segment store, a
few rounds each (``tests/kills.py``; twenty rounds each in ``tests/slow``;
the lake's in ``test_lake_kill``)."""

from __future__ import annotations

import random

from tests.kills import kill_compactions, kill_writes


def test_a_writer_killed_mid_write_loses_no_acknowledged_write(tmp_path):
    kill_writes(tmp_path / "data", rounds=3, rng=random.Random(1))


def test_a_compaction_killed_at_any_point_loses_nothing_and_leaves_a_store_that_opens(tmp_path):
    kill_compactions(tmp_path / "data", rounds=4, rng=random.Random(2))
