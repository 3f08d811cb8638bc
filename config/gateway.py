"""The gateway's configuration sections: `agents:`, `connectors:` and `gateway:`.

They are part of the one configuration (validated with every other section, so a broken entry is one
line naming the file and key), but only `mibyan gateway` acts on them. An untrusted project's
`.mibyan/config.yaml` cannot set them: the trust allow-list does not name them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from pydantic import Field

from mibyan.config.section import Section as _Section

ID_PATTERN = r"^[a-z0-9_-]+$"


class AgentTools(_Section):
    """Which tools a gateway agent's model sees: toolsets (the main `tools.toolsets` when omitted)."""

    toolsets: list[str] | None = None
    allow: list[str] = []
    deny: list[str] = []


class Isolation(_Section):
    """`enabled`: every run's tools work in a fresh sandbox holding only the agent's workspace;
    `network`: its commands may use the network (off by default)."""

    enabled: bool = False
    network: bool = False


class GatewayAgent(_Section):
    """One agent the gateway serves (seed 004's fields)."""

    id: str = Field(pattern=ID_PATTERN)
    name: str | None = None
    default: bool = False
    provider: str | None = None
    model: str | None = None
    max_iterations: int = Field(default=10, gt=0)
    max_tool_failures: int = Field(default=3, gt=0)
    tools: AgentTools = AgentTools()
    isolation: Isolation = Isolation()
    mcp_servers: list[str] = []  # names of `mcp_servers:` its runs may use (none by default)
    # per_channel: what it learns of a user (USER.md, facts) stays in that user's channel;
    # shared: every channel reads and writes the agent's own, as one user's assistant would
    memory: Literal["per_channel", "shared"] = "per_channel"


class MailServer(_Section):
    """An email connector's IMAP or SMTP server; `none` (no TLS) only to a loopback host."""

    host: str
    port: int = Field(ge=1, le=65535)
    tls: Literal["ssl", "starttls", "none"] = "ssl"


class XmppServer(_Section):
    """Where an xmpp connector connects (omitted: the JID's domain, port 5222)."""

    host: str
    port: int = Field(default=5222, gt=0, le=65535)


class Connector(_Section):
    """One connector: where messages arrive, and the agent that owns them (every agent when omitted).

    `host`, `port` and `token_env` are the http kind's; `homeserver` to `groups` the matrix kind's;
    `address` to `poll_seconds` the email kind's; `jid` to `nick` the xmpp kind's (with `password_env` and
    `allow`; checked when the connector is made: `gateway/connectors/matrix_setup.py`).
    """

    name: str = Field(pattern=ID_PATTERN)
    kind: Literal["http", "matrix", "email", "xmpp"]
    agent: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8642, ge=0, le=65535)
    token_env: str = "MIBYAN_GATEWAY_TOKEN"
    # a peer that sends this many wrong tokens in a row is answered 429 for auth_block seconds, twice as
    # long each time it happens again
    auth_failures: int = Field(default=10, gt=0)
    auth_block: float = Field(default=60, gt=0)
    # seconds a client has for its request's headers, and for its body; open connections at most
    header_timeout: float = Field(default=10, gt=0)
    body_timeout: float = Field(default=30, gt=0)
    max_connections: int = Field(default=200, gt=0)
    homeserver: str | None = None
    user_id: str | None = None
    password_env: str | None = None
    access_token_env: str | None = None
    allow: list[str] | None = None
    groups: Literal["mention", "all", "ignore"] = "mention"
    # how a chat shows the tools a run uses: one status message edited in place (the default where the
    # platform edits messages: matrix, xmpp), a message each, or nothing (email: one reply per mail, always)
    progress: Literal["edit", "messages", "off"] | None = None
    address: str | None = None
    imap: MailServer | None = None
    smtp: MailServer | None = None
    username: str | None = None  # the IMAP and SMTP login (omitted: the address)
    poll_seconds: float = Field(default=60, gt=0)  # an IMAP server without IDLE is asked this often
    # seconds an approval question waits for its answer here (omitted: `approvals.timeout`; email: 1800)
    approval_timeout: float | None = Field(default=None, gt=0)
    jid: str | None = None
    server: XmppServer | None = None
    ca_file: str | None = None  # relative: to the home (where config.yaml is)
    rooms: list[str] = []
    nick: str | None = None  # in rooms (omitted: the JID's local part)


class GatewaySection(_Section):
    max_concurrent: int = Field(default=16, gt=0)
    approvals: Literal["deny", "ask"] = "deny"
    shutdown_grace: float = Field(default=30, ge=0)
    redeliver_within: float = Field(default=600, ge=0)
    max_attachment_mb: float = Field(default=10, ge=0)  # a file a user sends larger than this is not kept
    # a channel claimed by a gateway that stopped renewing it is taken over after this (shared stores)
    lease_seconds: float = Field(default=30, gt=0)
    # seconds between two looks at a shared store for what another gateway did (a reply, a lease let go,
    # an answer), when no notice woke this one sooner (PostgreSQL's LISTEN/NOTIFY does, at once)
    poll_seconds: float = Field(default=1.0, gt=0)


def check_agents(agents: Sequence[GatewayAgent], providers: Collection[str] | None) -> None:
    """ValueError when two agents share an id or one names a provider that is not configured."""
    seen: set[str] = set()
    for agent in agents:
        if agent.id in seen:
            raise ValueError(f"two agents have the id '{agent.id}'; ids must be unique")
        seen.add(agent.id)
        if providers is not None and agent.provider is not None and agent.provider not in providers:
            known = ", ".join(sorted(providers))
            raise ValueError(f"agent '{agent.id}': unknown provider '{agent.provider}' (known: {known})")


def check_connectors(connectors: Sequence[Connector], agents: Sequence[GatewayAgent] | None) -> None:
    """ValueError when two connectors share a name or one routes to an agent that is not configured."""
    ids = {agent.id for agent in agents or ()}
    seen: set[str] = set()
    for connector in connectors:
        if connector.name in seen:
            raise ValueError(f"two connectors are named '{connector.name}'; names must be unique")
        seen.add(connector.name)
        if connector.agent is not None and connector.agent not in ids:
            known = ", ".join(sorted(ids)) or "none configured under agents:"
            raise ValueError(
                f"connector '{connector.name}': unknown agent '{connector.agent}' (known: {known})"
            )
