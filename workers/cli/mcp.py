"""``dimple mcp``: the MCP server (``workers.mcp``) for an agent, on stdio or streamable HTTP."""

from __future__ import annotations

import importlib.util
import sys

from pipeline.errors import InputError
from workers.mcp.tools import Pins
from workers.settings import mask_url

from .common import cli_settings


def register(sub) -> None:
    """Add ``mcp`` to the ``dimple`` parser."""
    m = sub.add_parser(
        "mcp", help="serve remember, search, forget, get and explain as MCP tools to an agent (stdio, or --http)",
        description="An MCP server on the store (embedded), or on the workers when DIMPLE_BROKER_URL is set. "
                    "Needs the mcp extra: pip install 'dimple[mcp]'.")
    m.add_argument("--namespace", action="append", default=[], metavar="NS",
                   help="pin the server to this namespace (repeatable): its tools never read or write outside them")
    m.add_argument("--http", action="store_true", help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio")
    m.add_argument("--host", help="address to listen on with --http (default DIMPLE_MCP__ADDRESS, 127.0.0.1); "
                                  "another than loopback needs DIMPLE_MCP__TOKEN")
    m.add_argument("--port", type=int, help="port to listen on with --http (default DIMPLE_MCP__PORT, 8765)")
    m.set_defaults(func=cmd_mcp)


def cmd_mcp(args) -> int:
    settings = cli_settings()
    pins = Pins.of(args.namespace)
    if importlib.util.find_spec("mcp") is None:
        raise InputError("mcp", "the MCP SDK is not installed: pip install 'dimple[mcp]' (or bash ops/install.sh mcp)")
    # the SDK is an optional extra, and only this command needs it (with uvicorn and starlette)
    from workers.mcp.server import build, check_http, serve_http, serve_stdio

    where = (f"the workers of {mask_url(settings.broker_url.get_secret_value())}" if not settings.embedded
             else f"the store in {settings.data_dir}")
    pinned = f", pinned to namespaces {pins.named()}" if pins else ""
    server = build(pins)
    if not args.http:
        print(f"dimple mcp: serving on stdio, on {where}{pinned}", file=sys.stderr)
        serve_stdio(server)
        return 0
    host = args.host or settings.mcp.address
    port = args.port if args.port is not None else settings.mcp.port
    if not 1 <= port <= 65535:
        raise InputError("--port", "a port from 1 to 65535")
    token = settings.mcp.token.get_secret_value()
    check_http(host, token)
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    print(f"dimple mcp: serving http://{shown}:{port}/mcp on {where}{pinned}"
          f"{'; every request needs the bearer token DIMPLE_MCP__TOKEN' if token else ''}", file=sys.stderr)
    serve_http(server, host, port, token)
    return 0
