"""Trimmed augment against carrying everything on more random stores than the
default tier draws (``tests/unit/test_augment.py`` holds the check)."""

from __future__ import annotations

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings

from tests.unit.test_augment import augment_cases, check_trimmed_augment
from tests.unit.test_scope import stores


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=stores(max_size=14), cases=augment_cases)
def test_trimmed_augment_gives_the_answer_of_carrying_everything_many(records, cases):
    check_trimmed_augment(records, cases)
