"""Every use of Celery's private attributes, in one place, for the Celery
minor version pyproject pins (``celery>=5.7,<5.8``);
``tests/unit/test_celery_compat.py`` fails when an upgrade moves any of them.

- ``reset_connections``: forget the app's cached broker pool and result
  backend (``_pool``, ``amqp._producer_pool``, ``_backend_cache``, ``_local``).
  Celery's result consumer gives up for good after a failed reconnect ("the
  application must be restarted"); this is that restart.
- ``ThrottledParentCheck``: ``AsyncResult._maybe_reraise_parent_error`` re-reads
  every parent stage's state after each message the result consumer gets;
  once per 50 ms is enough to notice a failed stage early.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from celery import Celery
from celery.result import AsyncResult

# The private names this module relies on (checked by the test).
APP_ATTRIBUTES = ("_pool", "_backend_cache", "_local")
RESULT_METHODS = ("_maybe_reraise_parent_error",)


def reset_connections(app: Celery) -> None:
    """Forget cached broker pools and the result backend; the next call reconnects."""
    app._pool = None
    if "amqp" in app.__dict__:
        app.amqp._producer_pool = None
    old = app._backend_cache or getattr(app._local, "backend", None)
    if old is not None:
        # Results still holding the abandoned backend unsubscribe through it
        # when garbage-collected; with its connection gone that would raise
        # inside __del__. They need nothing from it any more.
        old.remove_pending_result = lambda *args, **kwargs: None
    app._backend_cache = None
    app._local = threading.local()


class ThrottledParentCheck:
    """Mixin for an ``AsyncResult``: parent states are re-read at most every ``parent_check_s``."""

    parent_check_s = 0.05
    _parents_checked = float("-inf")

    def _maybe_reraise_parent_error(self) -> None:
        now = time.monotonic()
        if now - self._parents_checked < self.parent_check_s:
            return
        self._parents_checked = now
        super()._maybe_reraise_parent_error()  # type: ignore[misc]


def has_private_api() -> dict[str, bool]:
    """Which of the private names this module uses the installed Celery has."""
    app: Any = Celery("probe", set_as_current=False)
    found = {f"Celery.{a}": hasattr(app, a) or a in type(app).__dict__ for a in APP_ATTRIBUTES}
    found |= {f"AsyncResult.{m}": callable(getattr(AsyncResult, m, None)) for m in RESULT_METHODS}
    return found
