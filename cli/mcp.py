"""`mibyan mcp list` and the chat's `/mcp`: the MCP servers, their state and their tools.

Everything a server says about itself (its tools' names and descriptions, its errors) is made visible
before it is shown: a server is not mibyan.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mibyan.core.exit_codes import EXIT_OK, EXIT_USAGE
from mibyan.core.sanitize import visible

if TYPE_CHECKING:
    from mibyan.tools.mcp_connections import McpConnections, ServerState
    from mibyan.tools.sandbox import Sandbox

_NO_SERVERS = "no MCP servers are configured (mcp_servers: in {where})"


def _where(state: ServerState) -> str:
    settings = state.settings
    if settings.url is not None:
        return re.sub(r"//[^/@]*@", "//", settings.url)  # no password from the URL on the screen
    return " ".join([settings.command or "", *settings.args])


def describe(connections: McpConnections, offered: set[str] | None = None) -> list[str]:
    """The lines that show each server (state, how it is reached, approval) and its tools.

    Args:
        connections: the servers.
        offered: the tool names the model sees (an agent's), to mark the tools it does not; None
            lists every tool of each server as the filters of its configuration let it through.
    """
    from mibyan.tools.mcp_cache import MAX_TOOLS
    from mibyan.tools.mcp_tools import selected, tool_name

    lines: list[str] = []
    for state in connections.servers.values():
        cached = state.status == "starting" and state.tools is not None
        status = state.status + (", tools from the cache" if cached else "")
        approval = state.settings.approval
        lines.append(f"{state.name}  [{status}]  {_where(state)}  (approval: {approval})")
        if state.error:
            lines.append(f"    {state.error}")
        tools = (state.tools or []) if state.status in ("starting", "ready") else []
        shown = selected(tools, state.settings)
        taken: list[str] = []
        for tool in shown:
            name = tool_name(state.name, tool.name, taken)
            taken.append(name)
            marks = ["read-only"] if tool.read_only else []
            if offered is not None and name not in offered:
                marks.append("not offered")
            summary = (tool.description.strip().splitlines() or [""])[0][:90]
            lines.append(f"    {name}{'  (' + ', '.join(marks) + ')' if marks else ''}  {summary}")
        listing = state.listing
        for name, why in listing.invalid.items():
            lines.append(f"    {name}  (left out, not a valid tool: {why})")
        if listing.invalid_count > len(listing.invalid):
            lines.append(f"    ({listing.invalid_count - len(listing.invalid):,} more left out, not valid)")
        if listing.truncated:
            lines.append(f"    (it lists more than {MAX_TOOLS} tools: the rest are not read)")
        if len(shown) < len(tools):
            lines.append(f"    ({len(tools) - len(shown)} more left out by tools.include/exclude)")
    return [visible(line) for line in lines]


def run_mcp(args: argparse.Namespace) -> int:
    """`mibyan mcp list`: start each configured server, wait for it (up to mcp.start_timeout), list it."""
    from mibyan.cli.logs import setup_logging
    from mibyan.config.loader import load_settings
    from mibyan.config.paths import mibyan_home
    from mibyan.core.errors import MibyanError
    from mibyan.tools.mcp_connections import McpConnections

    home = mibyan_home()
    try:
        settings = load_settings(home=home)
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {visible(str(exc))}\n")
        return EXIT_USAGE
    if not settings.mcp_servers:
        sys.stdout.write(_NO_SERVERS.format(where=home / "config.yaml") + "\n")
        return EXIT_OK
    setup_logging(home)
    from mibyan.agent.agent_init import make_sandbox

    # each stdio server as an agent here starts it: in the sandbox, rooted at its cwd
    sandbox = make_sandbox(settings, home, None, source="cli")

    def confine(cwd: Path, writable: list[str]) -> Sandbox:
        return sandbox.rooted_at(cwd, writable=writable)

    timeout = settings.mcp.start_timeout
    with McpConnections(settings.mcp_servers, home=home, start_timeout=timeout, confine=confine) as servers:
        servers.wait_settled(timeout=settings.mcp.start_timeout + 1)
        sys.stdout.write("\n".join(describe(servers)) + "\n")
    return EXIT_OK
