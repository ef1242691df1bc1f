"""``workers.resources``' use of ``gc.freeze``: a process's first base is
collected once and frozen, a later load that replaces nothing joins what is
frozen, a base replaced thaws everything (so what the old base held can be
collected) until the next full collection freezes it again; nothing is done
where the collector is off (a one-query process)."""

from __future__ import annotations

import gc
import weakref

import pytest

from workers import resources


@pytest.fixture
def frozen():
    state = resources._Frozen()
    gc.callbacks.append(state.after_collection)
    try:
        yield state
    finally:
        gc.callbacks.remove(state.after_collection)
        gc.unfreeze()
        gc.enable()


def test_a_base_replaced_thaws_until_the_next_full_collection(frozen):
    held = [[] for _ in range(10)]  # tracked, alive
    frozen.settle()
    assert frozen.settled and gc.get_freeze_count() >= 10
    more = [[] for _ in range(10)]
    frozen.loaded()  # an embedder: what it loaded joins the frozen, no collection
    assert gc.get_freeze_count() >= 20 and not frozen.pending
    frozen.thaw()  # a base replaced
    assert gc.get_freeze_count() == 0 and frozen.pending
    frozen.loaded()  # thawed: left to the next full collection
    gc.collect(1)  # a younger collection leaves it thawed
    assert gc.get_freeze_count() == 0 and frozen.pending
    gc.collect()  # the next full collection: what survived it is frozen again
    assert gc.get_freeze_count() >= 20 and not frozen.pending
    del held, more


def test_garbage_an_old_base_left_in_a_cycle_is_collected_after_a_thaw(frozen):
    class Base:
        pass

    old = Base()
    old.self = old  # a cycle: only the collector frees it
    frozen.settle()
    ref = weakref.ref(old)
    del old
    gc.collect()  # frozen: never looked at
    assert ref() is not None
    frozen.thaw()  # a new base
    gc.collect()
    assert ref() is None


def test_the_first_load_settles_and_a_disabled_collector_is_left_alone(frozen):
    frozen.loaded()  # the first load of the process (an embedder before any base)
    assert frozen.settled and gc.get_freeze_count() > 0
    gc.unfreeze()
    gc.disable()
    frozen.settle()
    frozen.thaw()
    assert gc.get_freeze_count() == 0 and not frozen.pending
