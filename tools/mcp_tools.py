"""MCP tools as mibyan tools: `mcp__<server>__<tool>` specs that run through the executor like any other.

Each tool of a server becomes a `ToolSpec` (the registry's type) with the server's input schema, so the
pre/post hooks, the approval flow, the per-call timeout, the failure count and the result cap apply to
it as to a built-in tool. Approval is per server: `allow` runs its tools, `deny` refuses them, `ask`
(the default) asks the user about each tool (a "session" answer covers that tool from then on), except
the tools the server marks read-only. A result's text is joined; structured content comes as JSON;
images and other binary content are described, not passed on; an error result is a tool failure.

The specs belong to one agent (`ToolRuntime.local`), not to the global registry: two agents in one
process may have different servers of one name.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from mibyan.config.mcp import McpServerSettings
from mibyan.core.errors import ToolError
from mibyan.core.interruptible import InterruptSignal
from mibyan.tools.approval import Verdict, mcp_subject, mcp_verdict
from mibyan.tools.context import RunContext
from mibyan.tools.mcp_cache import MAX_TOOLS, McpTool
from mibyan.tools.mcp_connections import MISSING_SDK, McpConnections, ServerState
from mibyan.tools.registry import ToolSpec
from mibyan.tools.schema import ToolSchema

log = logging.getLogger("mibyan.mcp")

_MAX_NAME = 64
_MAX_DESCRIPTION = 4000
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")
#: How many of a server's invalid tools are named (a hostile server may list thousands).
_NAMED_INVALID = 5
#: Beyond the server's own timeout, how long the executor waits before it gives up on the call.
_EXECUTOR_GRACE = 5.0


def tool_name(server: str, tool: str, taken: Iterable[str] = ()) -> str:
    """`mcp__<server>__<tool>` with what a provider refuses replaced by `_`, at most 64 characters.

    A name that had to be cut, or that another tool already has, ends in a short hash of the tool's own
    name, so each tool keeps a name of its own.
    """
    name = f"mcp__{server}__{_UNSAFE_NAME.sub('_', tool)}"
    if len(name) > _MAX_NAME or name in set(taken):
        suffix = "_" + hashlib.sha256(tool.encode()).hexdigest()[:8]
        name = name[: _MAX_NAME - len(suffix)] + suffix
    return name


def selected(tools: list[McpTool], settings: McpServerSettings) -> list[McpTool]:
    """The tools the server's `tools: {include, exclude}` let through (shell-style patterns)."""
    include, exclude = settings.tools.include, settings.tools.exclude

    def matches(name: str, patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)

    return [t for t in tools if (not include or matches(t.name, include)) and not matches(t.name, exclude)]


def format_result(result: Any) -> tuple[str, bool]:
    """The text of a `CallToolResult` for the model, and whether the server called it an error."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            size = len(block.data) * 3 // 4
            parts.append(f"[{kind} from the tool: {block.mime_type}, about {size:,} bytes, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri} {block.name or ''}]".replace(" ]", "]"))
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if isinstance(text, str) else f"[binary resource {resource.uri}, not shown]")
        else:
            parts.append(f"[{kind or 'unknown'} content, not shown]")
    structured = result.structured_content
    if structured is not None and not any(parts):
        parts.append(json.dumps(structured, ensure_ascii=False, default=str))
    return "\n".join(parts) or "(the tool returned nothing)", bool(result.is_error)


def _subject(server: str, name: str) -> Callable[[dict[str, Any], RunContext], str]:
    def subject(args: dict[str, Any], ctx: RunContext) -> str:
        shown = json.dumps(args, ensure_ascii=False, indent=2) if args else "(no arguments)"
        return mcp_subject(server, name, shown)

    return subject


def _ask(server: str, name: str, *, editor: bool) -> Callable[[dict[str, Any], RunContext], Verdict]:
    verdict = mcp_verdict(server, name, editor=editor)
    return lambda args, ctx: verdict


def _parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """The input schema as a function's parameters: always an object, with properties."""
    parameters = dict(schema)
    parameters["type"] = "object"
    parameters.setdefault("properties", {})
    return parameters


class McpToolset:
    """The MCP tools one agent offers, as specs, kept up to date as its servers start or fail.

    Args:
        connections: the servers (the agent's own, or its parent's).
        owned: close() stops the servers (False for a subagent sharing its parent's).
        signal: the agent's interrupt signal (the first request's wait ends on it).
        default_timeout: seconds per call for a server without `timeout` (`agent.tool_timeout`).
        max_tools: the most MCP tools offered, all servers together (`mcp.max_tools`); the rest, in
            the order of the servers and of their lists, are left out and named.
        allow: when not empty, only these tools (`tools.allow`); deny: never these.
        only: when given, none but these (the agent's own allow list: a gateway agent's, a subagent's
            parent's offer), even when empty.
    """

    def __init__(
        self,
        connections: McpConnections,
        *,
        owned: bool,
        signal: InterruptSignal,
        default_timeout: float,
        max_tools: int = 128,
        allow: Iterable[str] = (),
        deny: Iterable[str] = (),
        only: Iterable[str] | None = None,
    ) -> None:
        self.connections = connections
        self.owned = owned
        self._signal = signal
        self._default_timeout = default_timeout
        self._max_tools = max_tools
        self._beyond_cap: dict[str, int] = {}  # per server, the tools the cap left out at the last specs()
        self._allow, self._deny = set(allow), set(deny)
        self._only = frozenset(only) if only is not None else None
        self._changed = threading.Event()
        self._changed.set()
        self._waited = False
        # what was said of each server (its failure, its left-out tools) and of the cap: said once each;
        # a subagent's toolset leaves all of that to its parent
        self._reported: dict[str, str | None] = {}
        self._reported_cap: dict[str, int] = {}
        self._from_last: set[str] = set()  # servers named from their last start's failure
        self._reported_tools: set[str] = set()
        if not owned:
            self._leave_to_owner()
        connections.on_change(self._on_change)
        if any(state.tools is None for state in connections.servers.values()):
            connections.start()  # the first request waits for these: start them now

    def _leave_to_owner(self) -> None:
        """What the connections' owner has said already (or says): not said again by this toolset."""
        for name, state in self.connections.servers.items():
            said = state.error if state.status == "failed" else None
            if state.last_failure_named:
                said = said or state.last_failure
                self._from_last.add(name)
            if said is not None:
                self._reported[name] = said
        self._reported_tools = set(self.connections.servers)

    def _on_change(self) -> None:
        self._changed.set()
        self._signal.notify()

    def refresh(self, *, wait: bool = True) -> dict[str, ToolSpec] | None:
        """The specs to offer now, or None when nothing changed since the last call.

        The first call with `wait` waits (interruptibly, until `mcp.start_timeout` after the start) for
        the servers whose tools are not cached yet: the first request should offer them.
        """
        if wait and not self._waited:
            self._waited = True
            unknown = [s for s in self.connections.servers.values() if s.tools is None]
            if unknown:
                deadline = max(s.deadline for s in unknown) + 0.2  # the watchdog's verdict included
                self._signal.wait_until(
                    lambda: all(s.settled.done() for s in unknown), max(0.0, deadline - time.monotonic())
                )
        if not self._changed.is_set():
            return None
        self._changed.clear()
        return self.specs()

    def specs(self) -> dict[str, ToolSpec]:
        """A spec for each offered tool of each server that is up, starting, or known from the cache."""
        specs: dict[str, ToolSpec] = {}
        beyond: dict[str, int] = {}
        for state in self.connections.servers.values():
            if state.status not in ("starting", "ready") or state.tools is None:
                continue
            if state.status == "starting" and state.last_failure is not None:
                continue  # it failed at its last start: its tools are offered once it is up
            for tool in selected(state.tools, state.settings):
                name = tool_name(state.name, tool.name, specs)
                if name in self._deny or (self._allow and name not in self._allow):
                    continue
                if self._only is not None and name not in self._only:
                    continue
                if len(specs) >= self._max_tools:
                    beyond[state.name] = beyond.get(state.name, 0) + 1
                    continue
                specs[name] = self._spec(state, tool, name)
        self._beyond_cap = beyond
        return specs

    def _spec(self, state: ServerState, tool: McpTool, name: str) -> ToolSpec:
        settings = state.settings
        timeout = settings.timeout or self._default_timeout
        connections, server, own_name = self.connections, state.name, tool.name

        def call(ctx: RunContext, /, **arguments: Any) -> str:
            if settings.approval == "deny":
                raise ToolError(
                    f"not run: the tools of the MCP server {server!r} are denied "
                    f"(mcp_servers.{server}.approval: deny)"
                )
            answer = connections.call(server, own_name, arguments, timeout=timeout, signal=ctx.signal)
            text, is_error = format_result(answer)
            if is_error:
                raise ToolError(text)
            return text

        description = (tool.description or f"{tool.name} (MCP server {server})")[:_MAX_DESCRIPTION]
        needs_asking = settings.approval == "ask" and not tool.read_only
        return ToolSpec(
            name=name,
            toolset="mcp",
            handler=call,
            schema=ToolSchema(name=name, description=description, parameters=_parameters(tool.input_schema)),
            # a server taken literally is an editor's (see mibyan.editors.servers)
            dangerous=_ask(server, name, editor=settings.literal) if needs_asking else None,
            subject=_subject(server, name),
            timeout=timeout + _EXECUTOR_GRACE,
            takes_context=True,
        )

    def notices(self) -> list[str]:
        """One line for each thing about the servers not said yet: a server left out (one line if the
        SDK is missing), a server's tools left out as invalid, the tools beyond `mcp.max_tools`."""
        servers = self.connections.servers.values()
        failed = [
            s
            for s in servers
            if s.status == "failed"
            and self._reported.get(s.name) != s.error
            and not (s.name in self._from_last and not s.live)  # out still: said once is enough
        ]
        # failed at its last start, and not up yet: said now, or a run that ends first never says it
        last = [
            s
            for s in servers
            if s.status == "starting"
            and s.last_failure is not None
            and not s.last_failure_named
            and s.name not in self._reported
        ]
        for state in last:
            state.last_failure_named = True  # by one of the toolsets sharing the connections only
            self._from_last.add(state.name)
        self._reported.update({s.name: s.error for s in failed} | {s.name: s.last_failure for s in last})
        if failed and all(s.error == MISSING_SDK for s in failed):
            names = ", ".join(s.name for s in failed)
            return [f"MCP servers configured ({names}) but {MISSING_SDK}: going on without them"]
        lines = [f"MCP server {s.name!r} is left out: {s.error}" for s in failed]
        lines += [
            f"MCP server {s.name!r} is left out: {s.last_failure} (at its last start; it is started "
            "again, and its tools are offered if it comes up)"
            for s in last
        ]
        lines += self._invalid_tools_notices()
        lines += self._cap_notices()
        for line in lines:
            log.warning(line)
        return lines

    def _invalid_tools_notices(self) -> list[str]:
        lines = []
        for state in self.connections.servers.values():
            listing = state.listing  # the server's own, or the cache's until it lists its tools
            if listing.invalid_count and state.name not in self._reported_tools:
                self._reported_tools.add(state.name)
                named = list(listing.invalid.items())[:_NAMED_INVALID]
                tools = "; ".join(f"{name!r} ({why})" for name, why in named)
                more = listing.invalid_count - len(named)
                tools += f"; and {more:,} more" if more else ""
                lines.append(f"MCP server {state.name!r}: tools left out, not valid: {tools}")
        return lines

    def _cap_notices(self) -> list[str]:
        if not self._beyond_cap or self._beyond_cap == self._reported_cap:
            return []
        self._reported_cap = dict(self._beyond_cap)
        servers = self.connections.servers
        parts = ", ".join(
            f"{count:,} of {name!r}"
            + (f" (and what it lists past its first {MAX_TOOLS})" if servers[name].listing.truncated else "")
            for name, count in self._beyond_cap.items()
        )
        total = sum(self._beyond_cap.values())
        return [f"{total:,} MCP tools left out, past mcp.max_tools ({self._max_tools}): {parts}"]

    def close(self) -> None:
        """Stop the servers if this toolset owns them; either way, stop following them."""
        self.connections.off_change(self._on_change)
        if self.owned:
            self.connections.close()
