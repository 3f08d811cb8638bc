"""The `mcp_servers:` and `mcp:` sections: MCP servers whose tools the agent may use.

A server is either a program mibyan starts and talks to over its stdin and stdout (`command`, `args`,
`env`, `cwd`) or a streamable HTTP endpoint (`url`, `headers`). `${NAME}` in `args`, `env` and `headers`
is replaced by the environment variable NAME when the server starts, so a key need not be written in
the file. Only the user's own files (and a project the user trusts) may name servers: starting one runs
a program.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from mibyan.config.section import Section as _Section

SERVER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


class McpToolFilter(_Section):
    """Which of a server's tools the model sees: `include` (all when empty), minus `exclude`."""

    include: list[str] = []
    exclude: list[str] = []


class McpServerSettings(_Section):
    """One MCP server: a command to start (stdio) or a URL (streamable HTTP)."""

    command: str | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = {}
    timeout: float | None = Field(default=None, gt=0)
    tools: McpToolFilter = McpToolFilter()
    approval: Literal["allow", "ask", "deny"] = "ask"
    #: A stdio server runs in the agent's sandbox (reads the machine, writes its cwd and temp); `off`
    #: runs it unconfined, which the agent says when it starts.
    sandbox: Literal["workspace-write", "off"] = "workspace-write"
    #: More places it may write in its sandbox (a cache: `~/.npm` for `npx`), beside `sandbox.writable`.
    writable: list[str] = []
    literal: bool = False  # no `${NAME}` from mibyan's environment (an editor's servers: see mibyan acp)

    @field_validator("url")
    @classmethod
    def _an_http_url(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"must be an http(s) URL such as http://127.0.0.1:8000/mcp, not {url!r}")
        return url

    @model_validator(mode="after")
    def _command_or_url(self) -> McpServerSettings:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a server mibyan starts) or url (a server running already)")
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd are for a command; a url server takes headers")
        if self.command is not None and self.headers:
            raise ValueError("headers are for a url server; a command takes env")
        if self.url is not None and {"sandbox", "writable"} & self.model_fields_set:
            raise ValueError(
                "sandbox and writable are for a command mibyan starts; a url server runs elsewhere"
            )
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


class McpSection(_Section):
    start_timeout: float = Field(default=10, gt=0)
    #: The most MCP tools offered to the model, all servers together: each schema rides on every request.
    max_tools: int = Field(default=128, ge=0)


def check_server_names(servers: dict[str, McpServerSettings]) -> dict[str, McpServerSettings]:
    """The servers, when each name is short and plain enough to be part of its tools' names."""
    for name in servers:
        if not SERVER_NAME.match(name):
            raise ValueError(
                f"server name {name!r}: use letters, digits, '_' and '-' (at most 32, starting with a "
                "letter or digit)"
            )
    return servers
