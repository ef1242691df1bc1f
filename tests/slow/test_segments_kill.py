"""The segment store's durability goal: SIGKILL of a writer during a write and
during compaction, twenty times each: no acknowledged write lost, no
forgotten memory back, the store opens every time (``tests/kills.py``; the
lake's: ``test_lake_kill.py``)."""

from __future__ import annotations

import random

from tests.conftest import on_segments
from tests.kills import kill_compactions, kill_writes
from tests.unit.test_segments import run_model


def test_twenty_writers_killed_mid_write(tmp_path):
    kill_writes(tmp_path / "data", rounds=20, rng=random.Random(20))


def test_twenty_compactions_killed(tmp_path):
    kill_compactions(tmp_path / "data", rounds=21, rng=random.Random(21))


@on_segments
def test_two_thousand_random_steps_match_the_model(settings):
    run_model(settings, steps=2000, seed=2000)
