"""``dimple mcp`` with ``DIMPLE_BROKER_URL`` set: the same tools run through
real workers (a real Redis, the real model) and give the embedded answers."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters, stdio_client

from tests.answers import Score
from tests.conftest import store_env
from tests.integration.test_audit_workers import _outbox_left

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NS = "mcp-workers"
# a word each, found by no other memory: a remember, then at once a get and a search for it
RYW_WORDS = [f"zqryw{letter * 3}" for letter in "abcdefghijklmnop"]


def _key(results: dict) -> list:
    return [(r["id"], Score(r["score"]), r["ranks"], [l["id"] for l in r["superseded_by"]]) for r in results["results"]]


def test_the_tools_through_the_workers_give_the_embedded_answers(demo_store, stack, tmp_path):
    import workers
    from workers.api import search

    queries = [json.loads(l) for l in demo_store.files["queries"].read_text(encoding="utf-8").splitlines() if l.strip()][:4]
    asks = [{"query": q["text"], "namespace": q.get("namespace"), "mode": m} for q in queries for m in ("hybrid", "keyword")]
    asks = [{k: v for k, v in a.items() if v is not None} for a in asks]
    workers.configure(demo_store.settings)  # embedded, in this process
    embedded = [search(a["query"], **{k: v for k, v in a.items() if k != "query"}).model_dump(mode="json") for a in asks]
    assert any(e["results"] for e in embedded)

    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           **store_env(demo_store.settings), "DIMPLE_BROKER_URL": stack.broker_url}
    params = StdioServerParameters(command=sys.executable, args=["-m", "workers.cli", "mcp"], env=env, cwd=str(tmp_path))

    async def run() -> dict:
        out: dict = {"search": []}
        with (tmp_path / "server.err").open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                for a in asks:
                    answer = await client.call_tool("search", a)
                    assert not answer.is_error, answer.content
                    out["search"].append(answer.structured_content)
                wrote = await client.call_tool("remember", {"records": [
                    {"id": "mw-1", "namespace": NS, "content": "the MCP worker note ZQ_MCP_7 about canary deploys"}]})
                assert not wrote.is_error, wrote.content
                out["remember"] = wrote.structured_content
                out["get"] = (await client.call_tool("get", {"ids": ["mw-1"]})).structured_content
                # read-your-writes through the workers: the write's version as min_version
                found = await client.call_tool("search", {"query": "ZQ_MCP_7", "namespace": NS, "mode": "keyword",
                                                          "min_version": wrote.structured_content["version"]})
                out["found"] = found.structured_content
                qid = out["search"][0]["query_id"]
                for _ in range(100):  # the audit worker writes the row off the query path
                    why = await client.call_tool("explain", {"query_id": qid})
                    if not why.is_error:
                        break
                    await anyio.sleep(0.2)
                out["explain"] = why
                out["forget"] = (await client.call_tool("forget", {"ids": ["mw-1"]})).structured_content
                # the server reads its own writes, whichever search process answers: no min_version given
                out["ryw"] = []
                for i, word in enumerate(RYW_WORDS):
                    wrote = await client.call_tool("remember", {"records": [
                        {"id": f"ryw-{i}", "namespace": NS, "content": f"an agent's note {word} on the deploy"}]})
                    assert not wrote.is_error, wrote.content
                    got = (await client.call_tool("get", {"ids": [f"ryw-{i}"]})).structured_content
                    hit = (await client.call_tool("search", {"query": word, "namespace": NS, "mode": "keyword"}))
                    assert not hit.is_error, hit.content
                    out["ryw"].append(([m["id"] for m in got["memories"]],
                                       [r["id"] for r in hit.structured_content["results"]]))
                ids = [f"ryw-{i}" for i in range(len(RYW_WORDS))]
                assert not (await client.call_tool("forget", {"ids": ids})).is_error
                out["ryw_gone"] = (await client.call_tool("get", {"ids": ids})).structured_content
        return out

    # other callers' queries keep both search processes busy, each looking for new writes every
    # store.poll_ms: one that looked just before a write answers the next read from before it
    workers.configure(demo_store.with_broker(stack.broker_url))
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            search("canary deploy", mode="keyword")

    others = [threading.Thread(target=traffic) for _ in range(2)]
    for t in others:
        t.start()
    try:
        out = anyio.run(run)
    finally:
        stop.set()
        for t in others:
            t.join(60)
        # their audit rows in before the next test, which may read the store's latest snapshot
        assert _outbox_left(demo_store.settings, within=60) == []
    assert "Traceback" not in (tmp_path / "server.err").read_text()
    for a, e, d in zip(asks, embedded, out["search"]):
        assert d["mode"] == e["mode"] == a["mode"]
        assert _key(d) == _key(e), a
    assert out["remember"]["ids"] == ["mw-1"] and out["remember"]["inserted"] == 1
    assert [m["id"] for m in out["get"]["memories"]] == ["mw-1"]
    assert [r["id"] for r in out["found"]["results"]] == ["mw-1"]
    assert out["found"]["store_version"] >= out["remember"]["version"]
    assert not out["explain"].is_error, out["explain"].content
    assert [p["id"] for p in out["explain"].structured_content["results"]] == [r["id"] for r in out["search"][0]["results"]]
    assert out["forget"]["forgotten"] == 1
    assert out["ryw"] == [([f"ryw-{i}"], [f"ryw-{i}"]) for i in range(len(RYW_WORDS))]
    assert out["ryw_gone"] == {"memories": []}
