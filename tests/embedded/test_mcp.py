"""``dimple mcp`` as an agent meets it: the MCP SDK's own client talking to a
``dimple mcp`` subprocess over stdio and over streamable HTTP, listing the
tools, calling each and reading their results (``search`` with a write's
version as ``min_version`` and an older one as ``as_of``); bad arguments as
tool errors naming the field; the bearer token and the loopback rule of
``--http``.

The store is a real one under a temporary data dir, embedded, with the hash
embedder (the server process reads ``DIMPLE_EMBEDDING_MODEL=hash-64``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from ops.stack import free_port
from pipeline.contracts import Results
from pipeline.store.writes import WriteResult
from tests.conftest import store_env
from workers.mcp.server import check_http, is_loopback

ROOT = Path(__file__).resolve().parents[2]
DIMPLE = Path(sys.executable).parent / "dimple"
TOKEN = "s3cret-token"
MEMORIES = [
    {"id": "deploy-1", "namespace": "code", "content_type": "decision", "content": "We deploy on Fridays before noon.",
     "topics": ["deploy"], "created_at": "2025-01-10T09:00:00Z"},
    {"id": "deploy-2", "namespace": "code", "content_type": "decision",
     "content": "No deploys on Fridays any more: the deploy window is Tuesday to Thursday.", "topics": ["deploy"],
     "supersedes": ["deploy-1"], "created_at": "2025-06-02T09:00:00Z"},
    {"id": "food-1", "namespace": "messages", "content": "Priya is vegetarian; the team liked the Thai place."},
]


def _store(data_dir: Path):
    """The settings of the store under data_dir, with the hash embedder: the
    server's and this process's."""
    from workers.settings import WorkerSettings

    return WorkerSettings(data_dir=data_dir, embedding_model="hash-64", _env_file=None)


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    """A server process's environment: this checkout and ``_store(data_dir)``."""
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(data_dir.parent), "PYTHONPATH": str(ROOT),
            "HF_HUB_OFFLINE": "1", **store_env(_store(data_dir)), **extra}


def _command() -> list[str]:
    """``dimple`` as installed beside this interpreter (the module when it is not)."""
    return [str(DIMPLE)] if DIMPLE.exists() else [sys.executable, "-m", "workers.cli"]


def _text(result) -> str:
    return "".join(block.text for block in result.content)


async def _every_tool(client: Client) -> dict:
    """List the tools, call each on the memories above, and check what comes back;
    returns the answers an in-process API call is compared with."""
    listed = {t.name: t for t in (await client.list_tools()).tools}
    assert set(listed) == {"remember", "search", "forget", "get", "explain"}
    search_in = listed["search"].input_schema
    assert search_in["required"] == ["query"]
    assert {"query", "namespace", "mode", "max_units", "topics", "supersession"} <= set(search_in["properties"])
    assert "origin" not in search_in["properties"]
    assert listed["search"].output_schema == Results.model_json_schema(mode="serialization")
    assert listed["remember"].output_schema == WriteResult.model_json_schema(mode="serialization")
    assert set(listed["remember"].input_schema["properties"]) == {"records", "skip_invalid"}
    assert set(listed["forget"].input_schema["properties"]) == {"ids", "reason"}
    assert set(listed["get"].input_schema["properties"]) == {"ids"}
    assert set(listed["explain"].input_schema["properties"]) == {"query_id", "why_not"}

    wrote = await client.call_tool("remember", {"records": MEMORIES})
    assert not wrote.is_error, _text(wrote)
    assert wrote.structured_content["ids"] == ["deploy-1", "deploy-2", "food-1"]
    assert wrote.structured_content["inserted"] == 3
    assert json.loads(_text(wrote)) == wrote.structured_content  # the same answer as text, for clients without structure

    found = await client.call_tool("search", {"query": "deploy before noon", "namespace": "code",
                                              "supersession": "annotate", "max_units": 5})
    assert not found.is_error, _text(found)
    res = Results.model_validate(found.structured_content)
    assert [r.id for r in res.results] == ["deploy-1", "deploy-2"]
    assert res.results[0].rank == 1 and set(res.results[0].ranks) == {"fts", "vector"}
    assert [l.id for l in res.results[0].superseded_by] == ["deploy-2"]  # graph context
    assert res.truncated is False and res.query_id

    cut = await client.call_tool("search", {"query": "deploy", "namespace": "code", "max_units": 1})
    assert cut.structured_content["truncated"] is True and len(cut.structured_content["results"]) == 1
    assert cut.structured_content["truncation"]["by"] == "maxUnits"

    cut_id = cut.structured_content["query_id"]
    served = cut.structured_content["results"][0]["id"]
    left_out = next(m["id"] for m in MEMORIES[:2] if m["id"] != served)
    miss = await client.call_tool("explain", {"query_id": cut_id, "why_not": left_out})
    assert not miss.is_error, _text(miss)
    assert miss.structured_content["memory_id"] == left_out and miss.structured_content["reason"] == "budget"
    assert miss.structured_content["stage"] == "search.budget"
    miss = await client.call_tool("explain", {"query_id": cut_id, "why_not": served})
    assert miss.structured_content["reason"] == "returned" and miss.structured_content["returned_rank"] == 1
    bad = await client.call_tool("explain", {"query_id": cut_id, "why_not": "no-such-memory"})
    assert bad.is_error and "why_not" in _text(bad)

    why = await client.call_tool("explain", {"query_id": res.query_id})
    assert not why.is_error, _text(why)
    assert why.structured_content["query_id"] == res.query_id
    assert [p["id"] for p in why.structured_content["results"]] == ["deploy-1", "deploy-2"]
    assert why.structured_content["results"][0]["leg_ranks"] == res.results[0].ranks
    assert why.structured_content["replay"]["verdict"] == "same list"

    got = await client.call_tool("get", {"ids": ["deploy-2", "nope"]})
    assert [m["id"] for m in got.structured_content["memories"]] == ["deploy-2"]
    assert got.structured_content["memories"][0]["supersedes"] == ["deploy-1"]

    bad = await client.call_tool("search", {"query": "deploy", "max_units": 0})
    assert bad.is_error and "max_units" in _text(bad) and "Traceback" not in _text(bad)
    bad = await client.call_tool("search", {"query": "deploy", "colour": "red"})
    assert bad.is_error and "colour" in _text(bad)
    bad = await client.call_tool("remember", {"records": [{"content": "no namespace"}]})
    assert bad.is_error and "record 1: namespace" in _text(bad) and "nothing was written" in _text(bad)
    bad = await client.call_tool("get", {"ids": [7]})
    assert bad.is_error and "ids[0]" in _text(bad)
    bad = await client.call_tool("explain", {"query_id": "feedfacefeedface"})
    assert bad.is_error and "query_id" in _text(bad)
    bad = await client.call_tool("search", {"query": "x" * 10_001})
    assert bad.is_error and "over the limit of 10000" in _text(bad)  # the API's limits

    # read-your-writes and time travel: a write's version as min_version, an earlier one as as_of
    first = wrote.structured_content["version"]
    late = await client.call_tool("remember", {"records": [
        {"id": "freeze-1", "namespace": "plans", "content": "Deploy freeze over the holidays."}]})
    later = late.structured_content["version"]
    assert later > first
    now = await client.call_tool("search", {"query": "deploy freeze holidays", "namespace": "plans",
                                            "min_version": later})
    assert not now.is_error, _text(now)
    assert [r["id"] for r in now.structured_content["results"]] == ["freeze-1"]
    then = await client.call_tool("search", {"query": "deploy freeze holidays", "as_of": first})
    assert not then.is_error, _text(then)
    assert "freeze-1" not in [r["id"] for r in then.structured_content["results"]] and \
        "deploy-1" in [r["id"] for r in then.structured_content["results"]]
    bad = await client.call_tool("search", {"query": "deploy", "min_version": -1})
    assert bad.is_error and "min_version" in _text(bad) and "Traceback" not in _text(bad)
    bad = await client.call_tool("search", {"query": "deploy", "as_of": later + 1000})
    assert bad.is_error and "as_of" in _text(bad) and "Traceback" not in _text(bad)

    gone = await client.call_tool("forget", {"ids": ["food-1", "nope"], "reason": "asked"})
    assert gone.structured_content["forgotten"] == 1 and gone.structured_content["not_found"] == ["nope"]
    got = await client.call_tool("get", {"ids": "food-1"})
    assert got.structured_content["memories"] == []
    past = await client.call_tool("search", {"query": "vegetarian Thai", "namespace": "messages", "as_of": first})
    assert not past.is_error, _text(past)
    assert past.structured_content["results"] == []  # time travel never brings a forgotten memory back
    return {"search": res}


def _same_answer_in_process(data_dir: Path, answer: Results) -> None:
    """The Python API, on the store the server wrote, serves what the tool served."""
    import workers
    from workers import api, resources

    before = resources.current().settings()
    workers.configure(_store(data_dir))
    try:
        again = api.search("deploy before noon", namespace="code", supersession="annotate", max_units=5)
    finally:
        workers.configure(before)
    assert [(r.id, r.rank, r.ranks, r.score) for r in again.results] == \
        [(r.id, r.rank, r.ranks, r.score) for r in answer.results]


def test_stdio_a_client_lists_and_calls_every_tool(tmp_path):
    data_dir = tmp_path / "data"
    command = _command()
    params = StdioServerParameters(command=command[0], args=[*command[1:], "mcp"], env=_env(data_dir), cwd=str(tmp_path))

    async def run() -> dict:
        with (tmp_path / "server.err").open("w") as errlog:  # the server's stderr
            async with Client(stdio_client(params, errlog=errlog)) as client:
                return await _every_tool(client)

    answers = anyio.run(run)
    err = (tmp_path / "server.err").read_text()
    assert "dimple mcp: serving on stdio" in err and "Traceback" not in err
    _same_answer_in_process(data_dir, answers["search"])


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    due = time.monotonic() + timeout
    while time.monotonic() < due:
        if proc.poll() is not None:
            raise AssertionError(f"dimple mcp --http exited with {proc.returncode}: {proc.stderr.read()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError("dimple mcp --http did not listen in time")


@pytest.fixture
def http_server(tmp_path):
    """``dimple mcp --http`` on a free loopback port, with a bearer token."""
    data_dir, port = tmp_path / "data", free_port()
    proc = subprocess.Popen([*_command(), "mcp", "--http", "--port", str(port)], cwd=tmp_path,
                            env=_env(data_dir, DIMPLE_MCP__TOKEN=TOKEN), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_listening(port, proc)
        yield f"http://127.0.0.1:{port}/mcp", data_dir, proc
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        assert "Traceback" not in err


def test_http_a_client_with_the_token_lists_and_calls_every_tool(http_server):
    url, data_dir, _ = http_server

    async def run() -> dict:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"},
                                      timeout=httpx2.Timeout(30, read=300)) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                return await _every_tool(client)

    answers = anyio.run(run)
    _same_answer_in_process(data_dir, answers["search"])


def test_http_refuses_a_request_without_the_token(http_server):
    url, _, _ = http_server
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        answer = httpx2.post(url, json=hello, headers={**headers, **auth}, timeout=30)
        assert answer.status_code == 401, auth
        assert "initialize" not in answer.text and "serverInfo" not in answer.text
    answer = httpx2.post(url, json=hello, headers={**headers, "Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert answer.status_code == 200  # the same request, with the token

    async def without_token() -> None:
        async with Client(url) as client:
            await client.list_tools()

    with pytest.raises(BaseException):  # noqa: B017  (the SDK reports a refused connection in its own way)
        anyio.run(without_token)


def test_http_will_not_start_on_another_address_without_a_token(tmp_path):
    port = free_port()
    done = subprocess.run([*_command(), "mcp", "--http", "--host", "0.0.0.0", "--port", str(port)], cwd=tmp_path,
                          env=_env(tmp_path / "data"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "0.0.0.0" in done.stderr and "DIMPLE_MCP__TOKEN" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # nothing listened


def test_the_loopback_rule():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.5", "::", "example.com", "localhost.example.com"))
    check_http("127.0.0.1", "")
    check_http("0.0.0.0", "token")
    with pytest.raises(Exception, match="DIMPLE_MCP__TOKEN"):
        check_http("192.168.1.10", "")
    # loopback, but not where the SDK refuses rebound host names: a token, or 127.0.0.1
    with pytest.raises(Exception, match="without DIMPLE_MCP__TOKEN only 127.0.0.1, localhost, ::1"):
        check_http("127.0.0.2", "")
    check_http("[::1]", "")
    check_http("127.0.0.2", "token")


def test_the_token_is_read_from_the_environment_and_masked(monkeypatch):
    from workers.settings import WorkerSettings

    monkeypatch.setenv("DIMPLE_MCP__TOKEN", TOKEN)
    monkeypatch.setenv("DIMPLE_MCP__PORT", "9100")
    s = WorkerSettings(_env_file=None)
    assert (s.mcp.token.get_secret_value(), s.mcp.port, s.mcp.address) == (TOKEN, 9100, "127.0.0.1")
    assert s.masked()["mcp"]["token"] == "****" and TOKEN not in json.dumps(s.masked())  # what dimple config prints


def test_without_the_sdk_the_command_says_what_to_install(monkeypatch, capsys):
    import importlib.util

    from workers.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else real(name, *a))
    assert main(["mcp"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'dimple[mcp]'" in err and len(err.strip().splitlines()) == 1
