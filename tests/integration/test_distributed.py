"""The same tasks on real workers through a real Redis give the embedded answers."""

from __future__ import annotations

import json
import re

import pytest

from tests.answers import Score

pytestmark = pytest.mark.integration


def _queries(demo, n=None):
    lines = demo.files["queries"].read_text(encoding="utf-8").splitlines()
    qs = [json.loads(l) for l in lines if l.strip()]
    return qs[:n] if n else qs


def _key(results):
    return [(r.id, Score(r.score), r.ranks, [l.id for l in r.superseded_by]) for r in results.results]


def test_search_async_matches_embedded(demo_store, stack):
    import workers
    from workers.api import search, search_async

    queries = _queries(demo_store, 12)
    asks = [dict(query=q["text"], namespace=q.get("namespace"), mode=m)
            for q in queries for m in ("hybrid", "keyword", "semantic")]

    workers.configure(demo_store.settings)  # embedded: eager, in-process
    embedded = [search(a["query"], **{k: v for k, v in a.items() if k != "query"}) for a in asks]
    assert any(r.results for r in embedded)

    workers.configure(demo_store.with_broker(stack.broker_url))
    handles = [search_async(a["query"], **{k: v for k, v in a.items() if k != "query"}) for a in asks]
    distributed = [h.get(timeout=60) for h in handles]

    for a, e, d in zip(asks, embedded, distributed):
        assert d.mode == e.mode == a["mode"]
        assert _key(d) == _key(e), a


def test_search_many_through_workers_matches_embedded(demo_store, stack):
    import workers
    from workers.api import search_many

    asks = [dict(query=q["text"], namespace=q.get("namespace")) for q in _queries(demo_store)]
    workers.configure(demo_store.settings)
    embedded = search_many(asks, batch_size=16)
    workers.configure(demo_store.with_broker(stack.broker_url))
    distributed = search_many(asks, batch_size=16)
    assert len(distributed) == len(asks)
    for a, e, d in zip(asks, embedded, distributed):
        assert _key(d) == _key(e), a


def test_a_pickled_message_is_refused(demo_store, stack):
    """JSON only on the wire: a worker refuses pickle and never runs the task."""
    import time

    import workers
    from workers.app import app

    workers.configure(demo_store.with_broker(stack.broker_url))
    log = stack.run_dir / "w-search.log"
    before = log.read_text(errors="replace") if log.exists() else ""
    res = app.send_task("search.scope", args=[{"states": []}], serializer="pickle", queue="search")
    deadline = time.time() + 20
    text = ""
    while time.time() < deadline:
        text = log.read_text(errors="replace")[len(before):]
        if "pickle" in text:
            break
        time.sleep(0.3)
    assert "Refusing to deserialize" in text and "pickle" in text
    assert f"search.scope[{res.id}] received" not in text  # never executed
    # and its sender is told at once (workers.celery_compat.tell_senders_of_refused)
    with pytest.raises(Exception, match="was not run: the worker could not decode it"):
        res.get(timeout=10)



def test_a_failing_stage_reaches_the_caller_as_an_error_not_a_hang(demo_store, stack):
    """Both legs of the chord raise on the workers: the caller's get() fails
    within seconds with a DimpleError naming the failure, not at its timeout."""
    import time

    import workers
    from pipeline.errors import DimpleError
    from workers import api

    workers.configure(demo_store.with_broker(stack.broker_url))
    batch = api._batch([("deploy window", None)])
    batch.states[0].query.top_k = "many"  # not validated on assignment; every stage's validation refuses it
    handle = api._dispatch(batch, single=True)
    t0 = time.monotonic()
    with pytest.raises(DimpleError) as info:
        handle.get(timeout=60)
    assert time.monotonic() - t0 < 20
    assert "top_k" in str(info.value)


def _latest_masked(error: Exception) -> str:
    text = str(error)
    assert re.search(r"latest is \d+", text), text
    return re.sub(r"latest is \d+", "latest is N", text)


@pytest.mark.parametrize("mode", ["hybrid", "keyword", "semantic"])
def test_a_legs_typed_error_reaches_the_caller_as_embedded(demo_store, stack, mode):
    """A snapshot the store does not hold: the legs refuse it with an
    ``InputError`` naming ``as_of``, and the caller gets that error through the
    workers as embedded, whichever legs run (a hybrid query's two legs are one
    chord, which reports a part's failure as a ``ChordError``)."""
    import workers
    from pipeline.errors import InputError
    from workers.api import search

    workers.configure(demo_store.settings)
    with pytest.raises(InputError) as embedded:
        search("deploy window", mode=mode, as_of=10**6)
    workers.configure(demo_store.with_broker(stack.broker_url))
    for _ in range(3):  # the chord's report, not the caller's occasional look at the parts, is what answers
        with pytest.raises(InputError) as distributed:
            search("deploy window", mode=mode, as_of=10**6)
        assert distributed.value.field == embedded.value.field == "as_of"
        # the same message but the store's latest snapshot, which audit batches (lake commits) move meanwhile
        assert _latest_masked(distributed.value) == _latest_masked(embedded.value)
