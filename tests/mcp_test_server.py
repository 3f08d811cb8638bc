"""An MCP server for the tests, written with the SDK's server API: run as a program it serves on stdio;
`build_server()` gives the same server to serve over streamable HTTP in the test process
(`serving_http`), where `calls` records what it was asked and `waiting` is set while `wait` runs."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp_types import CallToolResult, ToolAnnotations

#: A 1x1 PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


class Record:
    """What the in-process server saw: the calls' names, and the waits that started and were cancelled."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.waiting = threading.Event()
        self.cancelled = threading.Event()


def build_server(record: Record | None = None) -> MCPServer:
    seen = record or Record()
    server = MCPServer("mibyan-test")
    read_only = ToolAnnotations(read_only_hint=True)

    @server.tool(annotations=read_only)
    def echo(text: str) -> str:
        """Say the text back."""
        seen.calls.append("echo")
        return text

    @server.tool()
    def note(path: str, text: str) -> str:
        """Write the text into the file at path."""
        seen.calls.append("note")
        Path(path).write_text(text)
        return f"wrote {len(text)} characters"

    @server.tool(annotations=read_only)
    def fail(reason: str) -> str:
        """Fail with the reason given."""
        raise ToolError(reason)

    @server.tool(annotations=read_only)
    def numbers() -> CallToolResult:
        """Structured content only."""
        return CallToolResult(content=[], structured_content={"sum": 3, "items": [1, 2]})

    @server.tool(annotations=read_only)
    def picture() -> Image:
        """A tiny image."""
        return Image(data=PNG, format="png")

    @server.tool(annotations=read_only)
    async def wait(seconds: float) -> str:
        """Wait that many seconds."""
        seen.waiting.set()
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            seen.cancelled.set()
            raise
        return "waited"

    @server.tool(annotations=read_only)
    def pid() -> str:
        """The server's process id (in its sandbox's own PID namespace, where it has one)."""
        return str(os.getpid())

    started = uuid.uuid4().hex

    @server.tool(annotations=read_only)
    def instance() -> str:
        """A name of this start of the server: two calls answered by one process give the same."""
        return started

    @server.tool(annotations=read_only)
    def variable(name: str) -> str:
        """The value of one of the server's environment variables."""
        return os.environ.get(name, "(not set)")

    @server.tool(annotations=read_only)
    def quit() -> str:
        """End the server's process at once (as a crash would)."""
        os._exit(3)

    @server.tool(name="odd.name with/space" + "x" * 60, annotations=read_only)
    def odd() -> str:
        """A tool whose name no provider takes as it is."""
        return "odd"

    return server


@contextlib.contextmanager
def serving_http(record: Record) -> Iterator[str]:
    """The test server over streamable HTTP on a loopback port, in a thread; yields its URL."""
    import uvicorn

    app = build_server(record).streamable_http_app()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="critical", lifespan="on")
    http = uvicorn.Server(config)
    thread = threading.Thread(target=http.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not http.started:
            if not thread.is_alive():
                raise RuntimeError("the MCP test server did not start")
            threading.Event().wait(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        http.should_exit = True
        thread.join(5)
        sock.close()


if __name__ == "__main__":
    build_server().run()
