"""What a query that timed out on the workers says about its queues
(``workers.api._why_no_answer``), when asking the workers fails."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from workers import api


@pytest.fixture
def ask(monkeypatch):
    """Replace the workers' answer with a script of outcomes; return the list of asks made."""
    monkeypatch.setattr(api, "_last_check", ("", float("-inf"), set()))
    asks: list[int] = []

    def script(*outcomes):
        def consumed_queues(timeout: float = 1.0) -> set[str]:
            outcome = outcomes[len(asks)]
            asks.append(1)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        monkeypatch.setattr(api, "consumed_queues", consumed_queues)
        return asks
    return script


def test_a_failed_ask_is_asked_again_and_names_the_missing_queues(ask):
    asks = ask(RedisConnectionError("reset by peer"), {"audit"})
    why = api._why_no_answer()
    assert len(asks) == 2
    assert why.startswith("no worker is consuming the 'embed' and 'search' queues; start: ")


def test_two_failed_asks_say_what_failed(ask):
    asks = ask(RedisConnectionError("reset by peer"), RedisConnectionError("refused"))
    why = api._why_no_answer()
    assert len(asks) == 2
    assert why == ("are workers running for the embed and search queues? "
                   "(asking them failed: ConnectionError: refused)")


def test_workers_that_consume_both_queues_are_busy_or_stuck(ask):
    ask({"embed", "search", "audit"})
    assert api._why_no_answer().startswith("workers consume the embed and search queues but none answered in time")
