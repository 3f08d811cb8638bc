"""How an MCP server's tool list is read: page by page, capped, and one bad tool leaves that tool out,
not the server.

The SDK validates a `tools/list` answer whole: a single tool with an `inputSchema` of `"nope"` makes
`list_tools()` raise, and the server with all its good tools is lost. So the transport's streams are
wrapped: each answer to a `tools/list` request the client sent has its tools checked one by one, as the
SDK would check them, and the ones it would refuse are taken out (and remembered, to be named) before
the SDK sees the answer. Everything else passes through untouched.

Imported on the MCP thread only: it imports the SDK.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from mcp import types
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCRequest, JSONRPCResponse
from mcp_types.methods import validate_server_result
from pydantic import ValidationError

from mibyan.tools.mcp_cache import MAX_TOOLS, Listing, McpTool

log = logging.getLogger("mibyan.mcp")

#: How much of a bad tool's name is kept to name it (the server chose it).
_NAME_SHOWN = 80
_FALLBACK_VERSION = "2025-11-25"  # the SDK's own, before the version is negotiated


class ToolListCheck:
    """What the checks found: the tools left out (see Listing), for as long as the connection lasts.

    Args:
        server: the server's name, for the log.
        version: the negotiated protocol version, once known (the tools are checked against it).
    """

    def __init__(self, server: str, version: Callable[[], str | None]) -> None:
        self._server = server
        self._version = version
        self._listing: set[Any] = set()  # ids of the tools/list requests still unanswered
        self.listing = Listing()

    def sent(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, JSONRPCRequest) and message.method == "tools/list":
            self._listing.add(message.id)

    def received(self, item: Any) -> Any:
        if not isinstance(item, SessionMessage):
            return item
        message = item.message
        if not isinstance(message, JSONRPCResponse) or message.id not in self._listing:
            return item
        self._listing.discard(message.id)
        tools = message.result.get("tools")
        if isinstance(tools, list):  # anything else is a broken answer: the SDK says so, for the server
            message.result["tools"] = [tool for index, tool in enumerate(tools) if self._keeps(index, tool)]
        return item

    def _keeps(self, index: int, tool: Any) -> bool:
        version = self._version() or _FALLBACK_VERSION
        try:
            with contextlib.suppress(KeyError, ValueError):  # a version the SDK has no table for
                validate_server_result("tools/list", version, {"tools": [tool]})
            types.Tool.model_validate(tool, by_name=False)
        except ValidationError as exc:
            name, why = _name_of(index, tool), _reason(exc)
            if self.listing.invalid_count < 100:  # named in the log; a hostile list is not copied whole
                log.warning("MCP server %s: its tool %r is left out, not valid: %s", self._server, name, why)
            self.listing.leave_out(name, why)
            return False
        return True


def _name_of(index: int, tool: Any) -> str:
    name = tool.get("name") if isinstance(tool, dict) else None
    if isinstance(name, str) and name:
        return name[:_NAME_SHOWN]
    return f"#{index + 1} of its list"


def _reason(exc: ValidationError) -> str:
    """The first thing wrong, as the SDK words it: `inputSchema: Input should be a valid dictionary`."""
    errors = exc.errors(include_url=False, include_input=False)
    if not errors:
        return "not a valid tool"
    loc = list(errors[0]["loc"])
    if loc[:2] == ["tools", 0]:  # the check sees the tool as the one tool of a list: that says nothing
        loc = loc[2:]
    where = ".".join(str(part) for part in loc)
    msg = errors[0]["msg"]
    return f"{where}: {msg}" if where else msg


class _Reads:
    """The transport's read stream, with each tools/list answer checked on its way to the client."""

    def __init__(self, inner: Any, check: ToolListCheck) -> None:
        self._inner, self._check = inner, check

    @property
    def last_context(self) -> Any:  # the SDK's dispatcher reads it from a context-aware stream
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        return self._check.received(await self._inner.receive())

    def __aiter__(self) -> _Reads:
        return self

    async def __anext__(self) -> Any:
        return self._check.received(await self._inner.__anext__())

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Reads:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _Writes:
    """The transport's write stream, noting the ids of the tools/list requests sent."""

    def __init__(self, inner: Any, check: ToolListCheck) -> None:
        self._inner, self._check = inner, check

    async def send(self, item: SessionMessage, /) -> None:
        self._check.sent(item)
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Writes:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def checking_tool_lists(transport: Any, check: ToolListCheck) -> AsyncIterator[tuple[Any, Any]]:
    """`transport` (an SDK transport: yields a read and a write stream), its tool lists checked."""
    async with transport as streams:
        read, write = streams[0], streams[1]
        yield _Reads(read, check), _Writes(write, check)


async def list_tools(server: str, client: Any, listing: Listing) -> list[McpTool]:
    """The server's tools, page by page, up to `MAX_TOOLS` (each costs room in every request); a list
    cut there is marked in `listing`."""
    tools: list[McpTool] = []
    cursor = None
    for _ in range(100):  # a server whose pages never end cannot hold the start forever
        if len(tools) >= MAX_TOOLS:
            log.warning("MCP server %s lists more than %d tools; the rest are left out", server, MAX_TOOLS)
            listing.truncated = True
            return tools[:MAX_TOOLS]
        page = await client.list_tools(cursor=cursor)
        for tool in page.tools:
            annotations = tool.annotations
            tools.append(
                McpTool(
                    name=tool.name,
                    description=tool.description or tool.title or "",
                    input_schema=dict(tool.input_schema or {"type": "object"}),
                    read_only=bool(annotations is not None and annotations.read_only_hint),
                )
            )
        cursor = page.next_cursor
        if cursor is None:
            break
    listing.truncated = listing.truncated or len(tools) > MAX_TOOLS
    return tools[:MAX_TOOLS]
