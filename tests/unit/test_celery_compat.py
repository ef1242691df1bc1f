"""The private Celery names workers/celery_compat.py relies on exist in the
installed Celery, and resetting the app's connections makes it reconnect."""

from __future__ import annotations

from celery import Celery

from workers.celery_compat import has_private_api, reset_connections


def test_the_installed_celery_has_every_private_name_we_use():
    found = has_private_api()
    assert found and all(found.values()), {k: v for k, v in found.items() if not v}


def test_reset_connections_drops_the_cached_backend():
    app = Celery("t", set_as_current=False, broker="memory://", backend="cache+memory://")
    first = app.backend
    assert app.backend is first  # cached
    reset_connections(app)
    assert app.backend is not first and app._pool is None
