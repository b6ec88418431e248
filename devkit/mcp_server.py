"""The example MCP server of `serve --dev` (served as /mcp/devtools) and of the MCP tests: built with
the `mcp` package's MCPServer, on loopback. It has harmless tools (echo, word_count) that the example
policy lets Northwind call, and a destructive-sounding one (delete_repository, which deletes nothing)
that the example policy denies it. It records the headers of every request it gets, so tests can
show that a caller's token never reaches it, and can change a tool's definition (a rug pull)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from mcp.server.mcpserver import MCPServer

from devkit.server import serving

ECHO_DESCRIPTION = "Returns the text it is given, unchanged."


def echo(text: str) -> str:
    return text


def word_count(text: str) -> int:
    """Counts the words of a text (runs of characters between spaces)."""
    return len(text.split())


def delete_repository(name: str) -> str:
    """Deletes a repository and all of its history, permanently."""
    return f"repository {name!r} was not deleted: this is the development server's example tool"


def big_result(size: int) -> str:
    """Returns a text of `size` characters (tests of the result cap)."""
    return "x" * max(0, min(size, 8 << 20))


def example_server() -> MCPServer:
    server = MCPServer("devtools", instructions="Example tools for trying tenantgate's MCP gateway.")
    server.add_tool(echo, description=ECHO_DESCRIPTION)
    server.add_tool(word_count)
    server.add_tool(delete_repository)
    server.add_tool(big_result)
    return server


class ExampleMcpServer:
    """example_server() over Streamable HTTP at {url}, with the headers of each request it got."""

    def __init__(self) -> None:
        self.server = example_server()
        self.app = self.server.streamable_http_app(json_response=False)
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self.url = ""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            with self._lock:
                self.headers.append({k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]})
        await self.app(scope, receive, send)

    def change_echo(self, description: str) -> None:
        """Replaces echo's definition with one of another description (what a rug pull looks like)."""
        self.server.remove_tool("echo")
        self.server.add_tool(echo, description=description)


@contextmanager
def serving_example() -> Iterator[ExampleMcpServer]:
    example = ExampleMcpServer()
    with serving(example) as base_url:
        example.url = base_url + "/mcp"
        yield example
