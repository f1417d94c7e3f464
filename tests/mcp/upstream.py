"""A small MCP server (the SDK's MCPServer, formerly FastMCP) that aaa's MCP
tests put behind aaa, over stdio, or over Streamable HTTP with `--http PORT`.
Every execution of a tool is appended to the JSON Lines file named by
AAA_MCP_TEST_LOG (tool, arguments, the request's _meta, and over HTTP the
X-Bank-Key header it got), so the tests can count executions and check their
arguments."""

import json
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("bank")


def record(tool: str, arguments: dict, ctx: Context) -> None:
    meta = ctx.request_context.meta
    if meta is not None and hasattr(meta, "model_dump"):
        meta = meta.model_dump(by_alias=True, exclude_none=True)
    line = {"tool": tool, "arguments": arguments, "meta": dict(meta or {})}
    request = ctx.request_context.request
    if request is not None and hasattr(request, "headers"):
        line["bank_key"] = request.headers.get("x-bank-key")
    with open(os.environ["AAA_MCP_TEST_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(line, default=str) + "\n")


@server.tool()
def echo(text: str, ctx: Context) -> str:
    """Says the text back."""
    record("echo", {"text": text}, ctx)
    return f"echo: {text}"


@server.tool()
def wire_money(to: str, amount: int, ctx: Context) -> str:
    """Sends money (in the tests: writes a line)."""
    record("wire_money", {"to": to, "amount": amount}, ctx)
    return f"sent {amount} to {to}"


@server.tool()
def refuse(reason: str, ctx: Context) -> str:
    """Always fails with the reason: an MCP tool error (isError)."""
    record("refuse", {"reason": reason}, ctx)
    raise ToolError(reason)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
