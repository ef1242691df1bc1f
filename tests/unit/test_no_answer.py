"""What a query that timed out on the workers says about its queues
(``workers.api._why_no_answer``), when asking the workers fails."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from workers import api


@pytest.fixture
def ask(monkeypatch):
    """Replace the workers' answer with a script of outcomes (a set, an exception,
    or a callable returning one); return the list of asks made."""
    monkeypatch.setattr(api._CONSUMERS, "last", ("", float("-inf"), set()))
    asks: list[int] = []

    def script(*outcomes):
        def consumed_queues(timeout: float = 1.0) -> set[str]:
            outcome = outcomes[len(asks)]
            asks.append(1)
            if callable(outcome):  # an ask that does something first (takes time), then answers
                outcome = outcome()
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        monkeypatch.setattr(api, "consumed_queues", consumed_queues)
        return asks
    return script


def test_a_failed_ask_is_asked_again_and_names_the_missing_queues(ask):
    asks = ask(RedisConnectionError("reset by peer"), {"audit"})
    why = api._why_no_answer(("embed", "search"))
    assert len(asks) == 2
    assert why.startswith("no worker is consuming the 'embed' and 'search' queues; start: ")


def test_two_failed_asks_say_what_failed(ask):
    asks = ask(RedisConnectionError("reset by peer"), RedisConnectionError("refused"))
    why = api._why_no_answer(("embed", "search"))
    assert len(asks) == 2
    assert why == ("are workers running for the embed and search queues? "
                   "(asking them failed: ConnectionError: refused)")


def test_workers_that_consume_both_queues_are_busy_or_stuck(ask):
    ask({"embed", "search", "audit"})
    assert api._why_no_answer(("embed", "search")).startswith("workers consume the embed and search queues but none answered in time")



def test_an_ask_that_failed_slowly_is_not_asked_again(ask, monkeypatch):
    """A first ask that failed only after waiting out its answers (a broker
    that is down and slow to say so) is not repeated: a second would cost as
    much again and tell the same."""
    clock = [1000.0]
    monkeypatch.setattr(api.time, "monotonic", lambda: clock[0])

    def slow_failure():
        clock[0] += 2 * api.CONSUMER_CHECK_S + 0.1
        return RedisConnectionError("timed out")

    asks = ask(slow_failure, {"embed", "search"})
    why = api._why_no_answer(("embed", "search"))
    assert len(asks) == 1
    assert why == ("are workers running for the embed and search queues? "
                   "(asking them failed: ConnectionError: timed out)")


def test_an_ask_that_failed_just_inside_its_wait_is_asked_again(ask, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(api.time, "monotonic", lambda: clock[0])

    def late_failure():
        clock[0] += 2 * api.CONSUMER_CHECK_S - 0.1
        return RedisConnectionError("reset by peer")

    asks = ask(late_failure, {"embed", "search", "audit"})
    assert api._why_no_answer(("embed", "search")).startswith("workers consume the embed and search queues")
    assert len(asks) == 2


def test_a_keyword_query_s_timeout_names_only_the_search_queue(monkeypatch):
    """A keyword canvas leaves search.embed out: a missing embed worker is not its cause."""
    from workers import api

    monkeypatch.setattr(api, "_ask_consumers", lambda: {"embed"})
    monkeypatch.setattr(api._CONSUMERS, "last", ("", float("-inf"), set()))
    why = api._why_no_answer(("search",))
    assert "no worker is consuming the 'search' queue" in why and "embed" not in why
