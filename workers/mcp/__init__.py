"""``dimple mcp``: dimple's Python API as Model Context Protocol tools, for
agents that attach memory as an MCP server. ``tools`` holds the tools (no
MCP SDK import); ``server`` serves them on the SDK (the ``mcp`` extra) over
stdio or streamable HTTP.
"""
