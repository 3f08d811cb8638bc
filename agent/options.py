"""AgentOptions: all an AIAgent is built from, written once.

`AIAgent(**kwargs)` takes these names as keyword arguments (the public contract); `AIAgent(options=...)`
takes them as one frozen value, which the command line, the editors' server, the gateway and delegation
build once and vary with `dataclasses.replace`. What the configuration says applies wherever a field is
left at None.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from mibyan.agent.callbacks import Callbacks

if TYPE_CHECKING:
    import httpx2

    from mibyan.agent.memory import MemoryStore
    from mibyan.agent.providers import ProviderHealth, SdkClients
    from mibyan.tools.context import FileAccess
    from mibyan.tools.mcp_connections import McpConnections
    from mibyan.tools.sandbox import Sandbox

__all__ = ["AgentOptions"]


@dataclass(frozen=True, kw_only=True)
class AgentOptions:
    """How to build an AIAgent: its provider chain, tools, session, places and callbacks.

    Attributes:
        model: the model name; `model.name` from the configuration when omitted.
        provider: a provider of the configuration (`openai`, `anthropic`, `openrouter`, or your own).
        base_url: the provider's API address, overriding the configured one.
        api_key: the key, overriding the provider's `api_key_env` variable.
        api_mode: "chat_completions", "codex_responses" or "anthropic_messages"; resolved when omitted.
        max_iterations: model calls one run_conversation may make (`agent.max_turns`, default 500).
        enabled_toolsets: the toolsets the model sees (`tools.toolsets`).
        session_id: continue this session (at its newest compression descendant) when it exists;
            otherwise start a session with this id. A new id is made when omitted.
        home: the mibyan home (`$MIBYAN_HOME`, else `~/.mibyan`).
        stream: stream replies (`agent.stream`, default True).
        fallback_providers: `[{"provider": ..., "model": ...}]` to fail over to, in order.
        source: who started the session ("cli", "python", "subagent", ...), shown in `mibyan sessions`.
        yolo: run dangerous commands without asking (hardline ones never run).
        denied_tools: tools this agent may not use, on top of `tools.deny`.
        allowed_tools: when given, the only tools this agent is offered, its MCP servers' included (on
            top of `tools.allow`); a list without an `mcp__` name offers no MCP tool.
        http_transport: an httpx2 transport for the model calls (e.g. `httpx2.MockTransport` in tests);
            the default opens real connections.
        workspace: a folder with the agent's own SOUL.md, MEMORY.md, USER.md, skills/ and AGENTS.md, used
            instead of the home's (the session store stays the home's state.db). When it lies in the
            home (a gateway agent's), it is the only part of the home the tools may read, and `workdir`
            (inside it) the only part they may write.
        workdir: the tools' working directory: relative paths, commands and the sandbox's root; the
            process's own when omitted (it is never changed, so agents in threads may differ).
        sandbox: confine commands with this sandbox instead of the one `sandbox:` configures.
        max_tool_failures: consecutive failures of one tool before the model is told to change course
            (`agent.max_tool_failures`, default 3).
        mcp_servers: more MCP servers for this agent, by name, in the shape of `mcp_servers:` in the
            configuration (an editor's servers, say), joined to the configured ones.
        mcp_connections: the running MCP servers of another agent to use instead of starting the
            configured ones (a subagent shares its parent's); the other agent stays their owner.
        provider_health: a `ProviderHealth` shared with other agents (a gateway agent's runs share one):
            a provider that failed in any of them is skipped for `agent.health_check_interval`, and each
            turn starts on the first provider of the chain that has not failed within it. Without one,
            the agent keeps its own record for choosing a fallback, and each turn starts with the primary.
        sdk_clients: an `SdkClients` shared with other agents (a gateway agent's runs share one): the
            agent takes its SDK client from it and gives it back when it closes, so a run reuses the
            connection of the one before. Without one, the agent makes its own and closes it.
        file_access: where read_file, write_file and patch read and write text instead of the disk
            (an editor's buffers); the path policy applies all the same.
        memory: where its memory files and facts are, when not the home's or its workspace's (a gateway
            channel's own).
        session_scope: the channel key whose sessions alone session_search may see (None: every session).
        compress_between_turns: compress a long history at the end of each turn; a caller that delivers
            the answer first (the gateway) turns it off and calls `compress_if_needed()` itself.
        unasked: why nobody could be asked, in the result of a dangerous command refused for want of an
            `approval_callback` (None: the terminal's words: use --yolo or run interactively).
        subagents_ask: a subagent's approval questions go to this agent's `approval_callback` (a
            gateway's channel) rather than being answered from this session's earlier answers.
        delegation_depth: how deep in delegate_task this agent is (0: nobody's subagent).
        callbacks: the callbacks of `agent.callbacks.Callbacks` (as keyword arguments: by their names).
    """

    model: str | None = None
    provider: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    api_mode: str | None = None
    max_iterations: int | None = None
    enabled_toolsets: Sequence[str] | None = None
    session_id: str | None = None
    home: str | os.PathLike[str] | None = None
    stream: bool | None = None
    fallback_providers: list[dict[str, Any]] | None = None
    source: str = "python"
    yolo: bool = False
    denied_tools: Sequence[str] | None = None
    allowed_tools: Sequence[str] | None = None
    http_transport: httpx2.BaseTransport | None = None
    workspace: str | os.PathLike[str] | None = None
    workdir: str | os.PathLike[str] | None = None
    sandbox: Sandbox | None = None
    max_tool_failures: int | None = None
    mcp_servers: dict[str, dict[str, Any]] | None = None
    mcp_connections: McpConnections | None = None
    provider_health: ProviderHealth | None = None
    sdk_clients: SdkClients | None = None
    file_access: FileAccess | None = None
    memory: MemoryStore | None = None
    session_scope: str | None = None
    compress_between_turns: bool = True
    unasked: str | None = None
    subagents_ask: bool = False
    delegation_depth: int = 0
    callbacks: Callbacks = field(default_factory=Callbacks)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> AgentOptions:
        """The options of `AIAgent(**kwargs)`: the fields by name, the callbacks by theirs.

        Raises:
            TypeError: a name that is neither (`unknown AIAgent argument(s): ...`), as a misspelt keyword
                argument would.
        """
        # `callbacks` itself is no keyword argument: callbacks are passed one by one, by name
        names = {option.name for option in fields(cls)} - {"callbacks"}
        callbacks = Callbacks.from_kwargs({k: v for k, v in kwargs.items() if k not in names})
        return cls(**{k: v for k, v in kwargs.items() if k in names}, callbacks=callbacks)
