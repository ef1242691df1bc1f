"""A server's own-writes floor (``workers.mcp.tools.Session``) when the store
it serves is replaced under it: the server's reads go on, from what the new
store holds, instead of waiting out ``store.min_version_wait_ms`` and
refusing every read until the new store's versions pass the old floor."""

from __future__ import annotations

import pytest

from pipeline.errors import VersionNotReachedError
from tests.conftest import store_settings


def test_a_store_replaced_under_a_server_is_read_as_it_is(embedded, tmp_path):
    import workers
    from workers import api, audit, resources
    from workers.mcp import tools

    session = tools.Session()
    for i in range(4):
        tools.remember(session, {"records": {"id": f"old-{i}", "namespace": "code", "content": f"deploy note {i}"}})
    assert session.written >= 4
    assert [m["id"] for m in tools.get(session, {"ids": ["old-3"]})["memories"]] == ["old-3"]
    # the store replaced (a data dir wiped and written again, a restore from before the writes)
    audit.flush()
    resources.current().close_store()
    fresh = store_settings(tmp_path / "replaced").replace(audit_enabled=False)
    workers.configure(fresh)
    version = api.remember([{"id": "new-1", "namespace": "code", "content": "the deploy window moved"}]).version
    assert version is not None and version < session.written
    # the first read waits out store.min_version_wait_ms (the default, 5 s), then reads the store as it is
    found = tools.search(session, {"query": "deploy window", "mode": "keyword"})
    assert [r.id for r in found.results] == ["new-1"]
    assert session.written == version  # the floor is the store's version now: the next reads do not wait
    assert [m["id"] for m in tools.get(session, {"ids": ["new-1", "old-3"]})["memories"]] == ["new-1"]
    # and the floor follows the server's writes again
    written = tools.remember(session, {"records": {"id": "new-2", "namespace": "code", "content": "deploy freeze"}})
    assert session.written == written.version > version
    resources.current().close_store()


def _refusing(seen: int | None):
    """A read that refuses every ``min_version`` above ``seen`` as the store does; the versions it was sent."""
    sent: list[int | None] = []

    def call(version):
        sent.append(version)
        if version is not None and (seen is None or version > seen):
            raise VersionNotReachedError(version, seen, 5000.0)
        return version

    return call, sent


def test_only_the_servers_own_floor_is_lowered_and_only_below_the_store():
    from workers.mcp.tools import Session

    session = Session(written=9)
    call, sent = _refusing(seen=4)  # the store holds version 4: the server's write at 9 is gone
    assert session.read(call) == 4 and sent == [9, 4] and session.written == 4
    session = Session(written=9)
    call, sent = _refusing(seen=4)
    with pytest.raises(VersionNotReachedError):  # a caller's own, newer min_version is the caller's to meet
        session.read(call, asked=12)
    assert sent == [12] and session.written == 9
    session = Session(written=9)
    call, sent = _refusing(seen=None)  # replaced by an empty store: reads with no floor at all
    assert session.read(call) is None and sent == [9, None] and session.written == 0
