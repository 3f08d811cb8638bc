"""The editor's MCP servers (from session/new and session/load) as mibyan's own `mcp_servers:` entries.

An editor hands its servers over with each session: a program to start (stdio) or an HTTP endpoint. They
join the ones in mibyan's configuration for that session only, under the same approval rules. Names are
made plain enough for tool names (`mcp__<server>__<tool>`); a server of a kind mibyan cannot reach (SSE)
is left out and the session says so.
"""

from __future__ import annotations

import re
from typing import Any

from acp.schema import HttpMcpServer, McpServerStdio

#: The longest server name, so that `mcp__<server>__<tool>` keeps room for the tool's name.
_LONGEST = 28

_UNPLAIN = re.compile(r"[^A-Za-z0-9_-]+")


def plain_name(name: str, taken: set[str]) -> str:
    """A server name of letters, digits, '_' and '-' (starting with a letter or digit), unique in `taken`."""
    base = _UNPLAIN.sub("-", name).strip("-_")[:_LONGEST] or "editor"
    candidate, number = base, 1
    while candidate in taken:
        number += 1
        candidate = f"{base}-{number}"
    return candidate


def editor_servers(
    servers: list[Any] | None, configured: set[str] | frozenset[str] = frozenset()
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """(the servers as `mcp_servers:` entries by name, the names of those left out).

    A server named like one in `configured` (mibyan's own) is renamed beside it (`files-2`): it never
    takes over the configured one's settings (its headers, env or approval), nor hides it.
    """
    entries: dict[str, dict[str, Any]] = {}
    left_out: list[str] = []
    for server in servers or []:
        if isinstance(server, McpServerStdio):
            entry: dict[str, Any] = {
                "command": server.command,
                "args": list(server.args),
                "env": {variable.name: variable.value for variable in server.env or []},
                "literal": True,  # the editor's values, not mibyan's environment's `${NAME}`s
            }
        elif isinstance(server, HttpMcpServer):
            headers = {h.name: h.value for h in server.headers or []}
            entry = {"url": server.url, "headers": headers, "literal": True}
        else:
            left_out.append(str(getattr(server, "name", "?")))
            continue
        entries[plain_name(server.name, set(entries) | set(configured))] = entry
    return entries, left_out
