"""The private Celery names workers/celery_compat.py relies on exist in the
installed Celery, resetting the app's connections makes it reconnect, and a
finished canvas leaves no waiter or result subscription behind."""

from __future__ import annotations

from celery import Celery
from celery.result import AsyncResult, GroupResult
from vine import promise

from workers.celery_compat import has_private_api, reset_connections, stop_waiting, stop_waiting_at_exit, waiting_on


def test_the_installed_celery_has_every_private_name_we_use():
    found = has_private_api()
    assert found and all(found.values()), {k: v for k, v in found.items() if not v}


def test_reset_connections_drops_the_cached_backend():
    app = Celery("t", set_as_current=False, broker="memory://", backend="cache+memory://")
    first = app.backend
    assert app.backend is first  # cached
    reset_connections(app)
    assert app.backend is not first and app._pool is None


def _redis_app() -> Celery:
    # nothing connects: the result consumer has no pubsub until it subscribes for real
    return Celery("t", set_as_current=False, broker="memory://", backend="redis://127.0.0.1:1/0")


def _canvas(app: Celery) -> AsyncResult:
    """A query canvas's result as Celery hands it back: the last stage, its
    parents, and the chord's header group (whose parts ignore their results),
    each part waited on the way Celery's group barrier does."""
    parts = [AsyncResult("descend", app=app), AsyncResult("fulltext", app=app)]
    header = GroupResult("group", parts, app=app, ready_barrier=promise())  # Celery's own barrier would connect
    fuse = AsyncResult("fuse", app=app, parent=header)
    last = AsyncResult("budget", app=app, parent=AsyncResult("augment", app=app, parent=fuse))
    consumer = app.backend.result_consumer
    for part in header.results:
        app.backend._pending_results[0].setdefault(part.id, {})[id(part)] = part
        consumer.subscribed_to.add(app.backend.get_key_for_task(part.id))
    return last


def test_stop_waiting_forgets_the_canvas_waiters_and_subscriptions():
    app = _redis_app()
    result = _canvas(app)
    assert waiting_on(app.backend) == {"descend", "fulltext"}
    stop_waiting(result)  # the pubsub never connected: the unsubscribes are bookkeeping only
    assert waiting_on(app.backend) == set()


def test_stop_waiting_leaves_other_canvases_alone():
    app = _redis_app()
    first = _canvas(app)
    header = GroupResult("g2", [AsyncResult("d2", app=app)], app=app, ready_barrier=promise())
    app.backend._pending_results[0].setdefault("d2", {})[id(header.results[0])] = header.results[0]
    app.backend.result_consumer.subscribed_to.add(app.backend.get_key_for_task("d2"))
    stop_waiting(first)
    assert waiting_on(app.backend) == {"d2"}


def test_at_exit_every_waiter_is_forgotten_without_the_network():
    app = _redis_app()
    _canvas(app)
    stop_waiting_at_exit(app)  # redis://127.0.0.1:1 is unreachable: any network call would raise
    assert waiting_on(app.backend) == set()
