"""``dimple mcp``: the tools of ``workers.mcp.tools`` served on the official
MCP SDK (``mcp``, the ``mcp`` extra), over stdio for a local agent or over
streamable HTTP for a shared one.

Over HTTP the server listens on loopback unless told otherwise, and will
not start on another address without a bearer token (``DIMPLE_MCP__TOKEN``);
with a token set, a request without it is answered 401 whatever the address.

A tool's bad argument comes back as a tool error (``isError``) whose text
names the field; an unexpected failure as a tool error naming its type, its
traceback logged on the server's stderr, never sent.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from functools import partial
from importlib.metadata import version
from typing import Any

import anyio
import mcp.types as types
import uvicorn
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from pydantic import BaseModel

from pipeline.contracts import text_problem
from pipeline.errors import DimpleError, InputError

from .tools import TOOLS, Pins, Session, Tool

log = logging.getLogger("dimple.mcp")

# Tool calls run one at a time, off the event loop: the embedded store and the
# API's Celery result consumer belong to the process, not to a thread.
CALLS_AT_ONCE = 1


def listed_tools(pins: Pins) -> list[types.Tool]:
    """The tools as ``tools/list`` gives them: input and output schemas from the contracts."""
    out = []
    for tool in TOOLS.values():
        output = tool.output.model_json_schema(mode="serialization") if tool.output is not None else None
        out.append(types.Tool(
            name=tool.name, description=tool.description, input_schema=tool.input_schema(pins), output_schema=output,
            annotations=types.ToolAnnotations(read_only_hint=tool.read_only, destructive_hint=tool.destructive,
                                              idempotent_hint=True)))
    return out


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def call(tool: Tool, session: Session, arguments: Any) -> types.CallToolResult:
    """Run one tool (blocking); its answer or its error, as a tool result."""
    try:
        value = tool.run(session, arguments)
    except DimpleError as exc:  # InputError names the field; IngestValidationError each record's
        return _error(f"{tool.name}: {type(exc).__name__}: {exc}")
    except Exception as exc:
        log.exception("tool %s failed", tool.name)
        return _error(f"{tool.name}: internal error ({type(exc).__name__}); the server's log has the details")
    data = value.model_dump(mode="json") if isinstance(value, BaseModel) else json.loads(json.dumps(value, default=str))
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(data, ensure_ascii=False))],
                                structured_content=data)


def build(pins: Pins) -> Server[Any]:
    """The MCP server (the SDK's low-level ``Server``) offering dimple's tools under ``pins``."""
    tools = listed_tools(pins)
    session = Session(pins)  # every client's calls read the writes made through this server
    limiter: list[anyio.CapacityLimiter] = []  # made in the event loop, at the first call

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = TOOLS.get(params.name)
        if tool is None:
            return _error(f"unknown tool {params.name!r}; the tools are {', '.join(TOOLS)}")
        if not limiter:
            limiter.append(anyio.CapacityLimiter(CALLS_AT_ONCE))
        arguments = params.arguments if params.arguments is not None else {}
        return await anyio.to_thread.run_sync(partial(call, tool, session, arguments), limiter=limiter[0])

    pinned = f" Pinned to namespaces {pins.named()}: nothing outside them is read or written." if pins else ""
    return Server(
        "dimple", version=version("dimple"),
        instructions="dimple: an agent's long-term memory. `remember` stores memories, `search` finds them "
                     "(hybrid full-text and vector retrieval with graph context), `get` reads them by id, `forget` "
                     f"removes them, `explain` says why a search served what it did.{pinned}",
        on_list_tools=list_tools, on_call_tool=call_tool)


def serve_stdio(server: Server[Any]) -> None:
    """Serve one client on stdin/stdout until it closes them (the SDK keeps
    stray prints off the wire: fd 1 points at stderr while it serves)."""

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine: ``localhost`` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# the loopback hosts on which the MCP SDK turns DNS-rebinding protection on (``streamable_http_app``):
# tokenless, a web page the user opens could otherwise reach remember and forget through another
# loopback address (127.0.0.2) by a name it rebinds there
TOKENLESS_HOSTS = ("127.0.0.1", "localhost", "::1")


def check_http(host: str, token: str) -> None:
    """Refuse to serve on ``host`` what only loopback may serve tokenless."""
    if not host or text_problem(host):
        raise InputError("--host", "an address to listen on")
    if not token and not is_loopback(host):
        raise InputError("--host", f"{host!r} is not a loopback address: set DIMPLE_MCP__TOKEN (a bearer token every "
                                   "request must carry) to serve on it, or listen on 127.0.0.1")
    if not token and host.strip("[]") not in TOKENLESS_HOSTS:
        raise InputError("--host", f"without DIMPLE_MCP__TOKEN only {', '.join(TOKENLESS_HOSTS)} are served (where "
                                   "requests naming another host are refused: DNS rebinding); set a token to serve "
                                   f"on {host!r}")


class BearerToken:
    """ASGI middleware: an HTTP request without ``Authorization: Bearer <token>``
    is answered 401 before the MCP app sees it (compared in constant time)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                body = json.dumps({"error": "unauthorized: send Authorization: Bearer <DIMPLE_MCP__TOKEN>"}).encode()
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="dimple"'),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def serve_http(server: Server[Any], host: str, port: int, token: str) -> None:
    """Serve streamable HTTP at ``http://host:port/mcp`` until stopped (SIGINT, SIGTERM)."""
    check_http(host, token)
    app: Any = server.streamable_http_app(host=host.strip("[]"))  # DNS-rebinding protection on loopback
    if token:
        app = BearerToken(app, token)
    uvicorn.Server(uvicorn.Config(app, host=host.strip("[]"), port=port, log_level="warning")).run()
