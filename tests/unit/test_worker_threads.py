"""A worker's background threads (the audit outbox drain, the lake's erase
check) outlive a moment when the settings cannot be read: a tuned row this
dimple cannot read raises in every ``settings()`` call until ``dimple tune
--reset``, and the thread must still be there after it."""

from __future__ import annotations

import pytest

from pipeline.errors import StoreError
from workers import audit, resources, upkeep


class _Stop(BaseException):
    """Ends the drain's endless loop from inside the test."""


def test_the_outbox_drain_survives_settings_it_cannot_read(monkeypatch):
    real = resources.current().settings
    reads = []

    def settings():
        reads.append(1)
        if len(reads) == 1:
            raise StoreError("the lake holds no tuned settings this dimple reads: 'dimple tune --reset' removes them")
        return real()

    def drain_once(*_):
        raise _Stop  # reached: the thread went on after the failed read

    monkeypatch.setattr(resources.current(), "settings", settings)
    monkeypatch.setattr(audit, "drain_once", drain_once)
    monkeypatch.setattr(audit.time, "sleep", lambda _: None)
    with pytest.raises(_Stop):
        audit._drain_forever()
    assert len(reads) == 2


def test_the_erase_check_survives_settings_it_cannot_read(monkeypatch):
    def settings():
        raise StoreError("the lake holds no tuned settings this dimple reads: 'dimple tune --reset' removes them")

    monkeypatch.setattr(resources.current(), "settings", settings)
    check = upkeep._Upkeep()
    check.stop.set()  # its first wait returns at once: the loop ends there
    check._run(None)  # returns at the stop rather than raising out of the thread
