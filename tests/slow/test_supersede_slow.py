"""Supersession's ``promote`` and ``hide`` on more random stores than the
default tier draws (``tests/unit/test_supersede.py`` holds the check)."""

from __future__ import annotations

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings

from tests.unit.test_scope import stores
from tests.unit.test_supersede import check_promote_and_hide, promote_cases


@hsettings(max_examples=28, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=stores(max_size=12), cases=promote_cases)
def test_promote_and_hide_keep_the_scope_and_place_every_successor_many(records, cases):
    check_promote_and_hide(records, cases)
