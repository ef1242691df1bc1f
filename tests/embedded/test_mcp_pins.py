"""A pinned ``dimple mcp --namespace code --namespace messages``: its tools
never read or write a memory outside those namespaces, whatever the
arguments say (hostile ones from ``tests/hostile.py``, ids and query ids of
the other namespaces, links into them).

The calls go through the MCP SDK's own client to the server built by
``workers.mcp.server.build``, in process (the transports have tests of their
own in ``test_mcp.py``), on a real embedded store with the hash embedder.
The figures (calls tried, refused with a tool error, results checked) are
printed at the end of the run (``tests/figures.py``).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from mcp import Client

from tests import hostile
from tests.figures import case, count, refused
from tests.unit.test_scope import _PROPERTY
from workers.mcp.server import build
from workers.mcp.tools import LINKS, Pins

PINS = ("code", "messages")
OUTSIDE_NS = ("secret", "other")
# Every outside memory's content carries this mark: no answer of a pinned server may hold it.
MARK = "zqxmark"
WORDS = ["deploy", "window", "friday", "redis", "cache", "error", "budget", "owner"]
TOPICS = ["deploy", "infra", "team"]
INSIDE = [{"id": f"in-{i}", "namespace": PINS[i % 2], "content": f"{WORDS[i % 8]} {WORDS[(i + 3) % 8]} inside {i}",
           "topics": [TOPICS[i % 3]]} for i in range(8)]
OUTSIDE = [{"id": f"out-{i}", "namespace": OUTSIDE_NS[i % 2],
            "content": f"{WORDS[i % 8]} {WORDS[(i + 3) % 8]} {MARK}{i} outside", "topics": [TOPICS[i % 3]]}
           for i in range(8)]
# Links across the line, written by an unpinned caller: a pinned server must not reveal them.
INSIDE[2]["conflicts"] = ["out-0"]
INSIDE[3]["supersedes"] = ["out-1"]
OUTSIDE[2]["supersedes"] = ["in-4"]
OUTSIDE[3]["supported_by"] = ["in-5"]
OUTSIDE_IDS = {r["id"] for r in OUTSIDE}
KNOWN_IDS = sorted({r["id"] for r in INSIDE} | OUTSIDE_IDS)


@pytest.fixture
def pinned_store(embedded):
    """The store above, and the query ids of searches an unpinned caller made
    outside the pins (one scoped to 'secret', one unscoped) and inside them."""
    from workers import api
    from workers import audit as worker_audit

    api.remember(INSIDE[:2] + OUTSIDE + INSIDE[2:])
    outside_queries = [api.search("deploy cache", namespace="secret").query_id, api.search("deploy redis").query_id]
    inside_queries = [api.search("deploy", namespace="code").query_id]
    worker_audit.flush()
    return {"outside_queries": outside_queries, "inside_queries": inside_queries}


def _text(result) -> str:
    return "".join(block.text for block in result.content)


# -- hostile arguments --------------------------------------------------------------------
ids = st.one_of(st.sampled_from(KNOWN_IDS), st.sampled_from(KNOWN_IDS).map(lambda i: f" {i}"), hostile.strings(),
                hostile.junk())
id_lists = st.one_of(st.lists(ids, max_size=4), ids)
known_ids = st.lists(st.sampled_from(KNOWN_IDS), max_size=3)
words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join)
extra = st.dictionaries(st.sampled_from(["namespaces", "origin", "scope", "*", "records[0]"]), hostile.junk(),
                        min_size=1, max_size=1)


def tool_calls(hostile_args: bool):
    """Calls of every tool. Benign ones (what a caller means: ids of both sides
    of the line included) get past validation to read and write; hostile ones
    attack every field as well."""

    def pick(good, bad):
        return st.one_of(good, bad) if hostile_args else good

    namespaces = pick(st.sampled_from(PINS), st.one_of(
        st.sampled_from(OUTSIDE_NS + ("Code", "code ", "secret\u200b")), hostile.strings(), hostile.junk()))
    text = pick(words, hostile.strings())
    record = st.fixed_dictionaries({"content": text}, optional={
        "id": pick(st.one_of(st.sampled_from(KNOWN_IDS), st.uuids().map(lambda u: f"new-{u.hex[:8]}")), ids),
        "namespace": pick(namespaces, st.sampled_from(OUTSIDE_NS)),
        "content_type": pick(st.sampled_from(["text", "note"]), hostile.strings()),
        "topics": pick(st.lists(st.sampled_from(TOPICS), max_size=2), hostile.labels(TOPICS)),
        "supersedes": pick(known_ids, id_lists), "conflicts": pick(known_ids, id_lists),
        "supported_by": known_ids,
    })
    remember = st.fixed_dictionaries(
        {"records": pick(st.one_of(record, st.lists(record, min_size=1, max_size=3)), hostile.junk())},
        optional={"skip_invalid": pick(st.booleans(), hostile.junk())})
    search = st.fixed_dictionaries({"query": pick(text, hostile.junk()), "namespace": pick(namespaces, st.none())}, optional={
        "topics": pick(st.lists(st.sampled_from(TOPICS + ["ns:secret", "ns:code", "ns:other"]), max_size=2),
                       hostile.labels(TOPICS)),
        "content_type": pick(st.sampled_from(["text", "note"]), hostile.labels(["text", "note"])),
        "mode": pick(st.sampled_from(["hybrid", "keyword", "semantic"]), st.sampled_from(["both", "", "HYBRID"])),
        "max_units": pick(st.integers(1, 20), hostile.numbers(1, 20)),
        "top_k": pick(st.integers(1, 50), hostile.numbers(1, 50)),
        "supersession": pick(st.sampled_from(["annotate", "promote", "hide"]), st.sampled_from(["reveal", "all"])),
    })
    forget = st.fixed_dictionaries({"ids": pick(known_ids.filter(bool), id_lists)},
                                    optional={"reason": pick(st.none() | st.just("asked"), hostile.strings())})
    get = st.fixed_dictionaries({"ids": pick(known_ids, id_lists)})
    # ("outside" | "inside" | "seen" | "prefix", i): a query id resolved when the call is made
    explain = st.fixed_dictionaries({"query_id": pick(
        st.tuples(st.sampled_from(["outside", "inside", "seen", "seen", "prefix"]), st.integers(0, 100)),
        st.one_of(hostile.strings(), hostile.junk()))}, optional={"why_not": pick(st.sampled_from(KNOWN_IDS), ids)})
    one = st.one_of(*(st.tuples(st.just(name), args) for name, args in (
        ("search", search), ("search", search), ("remember", remember), ("forget", forget), ("get", get),
        ("explain", explain))))
    if not hostile_args:
        return one
    return st.one_of(one, one.flatmap(lambda c: extra.map(lambda e: (c[0], {**c[1], **e}))))


calls = st.one_of(tool_calls(hostile_args=False), tool_calls(hostile_args=True))


class Run:
    """What the calls saw: query ids served inside the pins, ids written, calls made."""

    def __init__(self, queries: dict[str, list[str]]) -> None:
        self.queries = {**queries, "seen": list(queries["inside_queries"])}
        self.written: set[str] = set()
        self.calls = 0

    def resolve(self, arguments: dict[str, Any]) -> dict[str, Any]:
        value = arguments.get("query_id")
        if isinstance(value, tuple):
            kind, i = value
            pool = {"outside": self.queries["outside_queries"], "inside": self.queries["inside_queries"],
                    "seen": self.queries["seen"], "prefix": self.queries["outside_queries"]}[kind]
            qid = pool[i % len(pool)]
            arguments = {**arguments, "query_id": qid[: 4 + i % 8] if kind == "prefix" else qid}
        return arguments


def _outside(link_ids) -> set[str]:
    return set(link_ids) & OUTSIDE_IDS


def _check(run: Run, name: str, arguments: dict[str, Any], result) -> None:
    """One answer: no outside memory's id, content or link in it; errors are tool errors, never a crash."""
    body = _text(result)
    assert MARK not in body, (name, arguments)
    assert "internal error" not in body and "Traceback" not in body, (name, arguments, body)
    if result.is_error:
        refused("mcp.pinned")
        return
    data = result.structured_content
    if name == "search":
        for r in data["results"]:
            assert r["namespace"] in PINS and r["id"] not in OUTSIDE_IDS, (arguments, r["id"])
            assert r["promoted_above"] not in OUTSIDE_IDS
            for link in r["superseded_by"] + r["conflicts"] + r["supported_by"]:
                assert link["namespace"] in PINS and link["id"] not in OUTSIDE_IDS, (arguments, link)
        count("mcp.pinned", "results checked", len(data["results"]))
        run.queries["seen"].append(data["query_id"])
    elif name == "get":
        for m in data["memories"]:
            assert m["namespace"] in PINS and m["id"] not in OUTSIDE_IDS
            assert not _outside(t for k in LINKS for t in m[k]), m
        count("mcp.pinned", "results checked", len(data["memories"]))
    elif name == "explain" and arguments.get("why_not") is not None:  # null: not asked, a plain explain
        assert arguments["query_id"] not in run.queries["outside_queries"]
        assert data["memory_id"] not in OUTSIDE_IDS and not _outside(data["hidden_by"]), (arguments, data)
        assert data["scope"] is None or data["scope"]["namespace"] in PINS
    elif name == "explain":
        assert arguments["query_id"] not in run.queries["outside_queries"]
        assert not _outside(p["id"] for p in data["results"])
        assert not _outside(c.get("id") for c in (data["replay"] or {}).get("changes", []) if isinstance(c, dict))
    elif name == "remember":
        assert set(data["namespaces"]) <= set(PINS) and not _outside(data["ids"]), (arguments, data)
        run.written |= set(data["ids"])


def _json(value: Any) -> Any:
    """``value`` as JSON can carry it (bytes, which JSON has not, as text)."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


async def _calls(run: Run, pins: Pins, batch: list[tuple[str, dict]]) -> None:
    async with Client(build(pins)) as client:
        for name, arguments in batch:
            arguments = _json(run.resolve(arguments))
            with case("mcp.pinned"):
                run.calls += 1
                _check(run, name, arguments, await client.call_tool(name, arguments))


def _outside_as_it_was(snapshot: list[dict], by_namespace: dict[str, int]) -> None:
    """The outside memories as written (text, namespace, links), and no memory
    added outside. A link to an inside memory the pinned server forgot is gone
    with it, as a forgotten memory leaves every link (that is a read of the
    inside memory's absence, not a write outside): only such a link may go."""
    from pipeline.store.stats import store_stats
    from workers import api, resources

    linked = sorted({t for m in snapshot for k in LINKS for t in m[k]})
    live = {m["id"] for m in api.get(linked)} if linked else set()
    expected = [{**m, **{k: [t for t in m[k] if t in OUTSIDE_IDS or t in live] for k in LINKS}} for m in snapshot]
    assert api.get(sorted(OUTSIDE_IDS)) == expected
    snap = resources.current().snapshot()
    now = store_stats(snap.store, snap.overlay)["by_namespace"]
    assert {ns: now.get(ns, 0) for ns in OUTSIDE_NS} == by_namespace


def test_a_pinned_server_never_reads_or_writes_outside_its_namespaces(pinned_store):
    """At least 1,000 tool calls with hostile arguments: 0 reads or writes outside the pins."""
    from pipeline.store.stats import store_stats
    from workers import api, resources

    pins = Pins.of(list(PINS))
    run = Run(pinned_store)
    snapshot = api.get(sorted(OUTSIDE_IDS))
    assert len(snapshot) == len(OUTSIDE_IDS)
    snap = resources.current().snapshot()
    by_namespace = {ns: store_stats(snap.store, snap.overlay)["by_namespace"][ns] for ns in OUTSIDE_NS}

    @hsettings(max_examples=40, **_PROPERTY)
    @given(batch=st.lists(calls, min_size=25, max_size=30))
    def calls_in_one_session(batch):
        anyio.run(_calls, run, pins, batch)
        _outside_as_it_was(snapshot, by_namespace)

    calls_in_one_session()
    assert run.calls >= 1000
    _outside_as_it_was(snapshot, by_namespace)
    # what the pinned server wrote links to nothing outside (in-2 and in-3 were linked by an unpinned caller)
    for m in api.get(sorted(run.written)):
        assert m["namespace"] in PINS and not _outside(t for k in LINKS for t in m[k]), m


def test_a_pinned_server_hand_picked(pinned_store):
    """The cases the random run should hit, each once, by name."""
    pins = Pins.of(list(PINS))

    async def calls() -> dict[str, Any]:
        out = {}
        async with Client(build(pins)) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            out["namespace_schema"] = tools["search"].input_schema["properties"]["namespace"]
            out["required"] = tools["search"].input_schema["required"]
            for key, name, arguments in [
                ("get", "get", {"ids": ["in-2", "out-0", "in-3", "in-4"]}),
                ("search_no_ns", "search", {"query": "deploy"}),
                ("search_secret", "search", {"query": "deploy", "namespace": "secret"}),
                ("search_code", "search", {"query": "cache friday", "namespace": "code", "max_units": 50,
                                           "supersession": "annotate"}),
                ("remember_outside", "remember", {"records": [{"namespace": "secret", "content": "x"}]}),
                ("remember_taken_id", "remember", {"records": {"id": "out-3", "namespace": "code", "content": "x"}}),
                ("remember_link_out", "remember", {"records": {"namespace": "code", "content": "x",
                                                               "supersedes": ["out-2"]}, "skip_invalid": True}),
                ("remember_ok", "remember", {"records": {"id": "new-1", "namespace": "messages", "content": "x y",
                                                         "supersedes": ["in-0"]}}),
                ("forget", "forget", {"ids": ["out-4", "in-6", "nope"]}),
                ("explain_outside", "explain", {"query_id": pinned_store["outside_queries"][0]}),
                ("explain_unscoped", "explain", {"query_id": pinned_store["outside_queries"][1]}),
                ("explain_prefix", "explain", {"query_id": pinned_store["inside_queries"][0][:8]}),
                ("explain_inside", "explain", {"query_id": pinned_store["inside_queries"][0]}),
                ("why_not_outside", "explain", {"query_id": pinned_store["inside_queries"][0], "why_not": "out-0"}),
                ("why_not_inside", "explain", {"query_id": pinned_store["inside_queries"][0], "why_not": "in-1"}),
            ]:
                out[key] = await client.call_tool(name, arguments)
        return out

    out = anyio.run(calls)
    assert out["namespace_schema"]["enum"] == ["code", "messages"] and "namespace" in out["required"]
    got = out["get"].structured_content["memories"]
    assert [m["id"] for m in got] == ["in-2", "in-3", "in-4"]
    assert got[0]["conflicts"] == [] and got[1]["supersedes"] == []  # links to out-0, out-1 are not shown
    assert "namespace: required" in _text(out["search_no_ns"]) and out["search_no_ns"].is_error
    assert out["search_secret"].is_error and "'secret'" in _text(out["search_secret"])
    assert not out["search_code"].is_error
    for key in ("remember_outside", "remember_taken_id", "remember_link_out"):
        assert out[key].is_error and "nothing was written" in _text(out[key]), key
    assert "record 1: namespace" in _text(out["remember_outside"])
    assert "record 1: id" in _text(out["remember_taken_id"])
    assert "record 1: supersedes" in _text(out["remember_link_out"])
    assert out["remember_ok"].structured_content["ids"] == ["new-1"]
    gone = out["forget"].structured_content
    assert gone["forgotten"] == 1 and gone["not_found"] == ["out-4", "nope"]
    for key in ("explain_outside", "explain_unscoped", "explain_prefix"):
        assert out[key].is_error and "no audit row" in _text(out[key]), key
    assert not out["explain_inside"].is_error
    assert out["why_not_outside"].is_error and "no memory 'out-0' in namespaces" in _text(out["why_not_outside"])
    assert out["why_not_inside"].structured_content["reason"] == "out_of_scope"  # in-1 is in messages; the query, code

    from workers import api
    assert [m["id"] for m in api.get(["out-4", "in-6"])] == ["out-4"]  # the outside one is still there
