"""AIAgent: the public facade of mibyan's agent. The loop and its phases live in the agent/ mixins."""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any

from mibyan.agent.adapters.base import ToolSchema
from mibyan.agent.agent_init import init_agent
from mibyan.agent.conversation_loop import ConversationLoopMixin
from mibyan.agent.lifecycle import LifecycleMixin
from mibyan.agent.messages import Message
from mibyan.agent.prompt_builder import PromptBuilderMixin
from mibyan.agent.tool_executor import ToolExecutorMixin
from mibyan.agent.turn_api_call import ApiCallMixin
from mibyan.agent.turn_api_error import ApiErrorMixin
from mibyan.agent.turn_iteration_prep import IterationPrepMixin
from mibyan.agent.turn_overflow import OverflowMixin
from mibyan.agent.turn_recovery import RecoveryMixin
from mibyan.agent.turn_state import ConversationResult
from mibyan.agent.turn_truncation import TruncationMixin

if TYPE_CHECKING:
    import httpx2

    from agent_state import SessionStore
    from mibyan.agent.hooks import Hooks
    from mibyan.agent.memory import MemoryStore
    from mibyan.agent.providers import ProviderHealth, ProviderRuntime
    from mibyan.tools.approval import ApprovalPolicy
    from mibyan.tools.context import FileAccess
    from mibyan.tools.mcp_connections import McpConnections
    from mibyan.tools.sandbox import Sandbox

__all__ = ["AIAgent", "ConversationResult"]


class AIAgent(
    ConversationLoopMixin,
    IterationPrepMixin,
    ApiCallMixin,
    ApiErrorMixin,
    OverflowMixin,
    TruncationMixin,
    RecoveryMixin,
    ToolExecutorMixin,
    PromptBuilderMixin,
    LifecycleMixin,
):
    """A mibyan agent: one provider chain, one tool selection, one session.

    Args:
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
        file_access: where read_file, write_file and patch read and write text instead of the disk
            (an editor's buffers); the path policy applies all the same.
        **callbacks: the callbacks of `agent.callbacks.Callbacks`, by name.

    Use it as a context manager (`with AIAgent(...) as agent:`), or call `close()` when done: it holds a
    database connection, HTTP connections and the processes of its MCP servers.

    Raises:
        ConfigError: a broken configuration or a missing key, as one line naming the file and key.
    """

    def __init__(
        self,
        model: str | None = None,
        provider: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        api_mode: str | None = None,
        max_iterations: int | None = None,
        enabled_toolsets: list[str] | None = None,
        session_id: str | None = None,
        home: str | os.PathLike[str] | None = None,
        stream: bool | None = None,
        fallback_providers: list[dict[str, Any]] | None = None,
        source: str = "python",
        yolo: bool = False,
        denied_tools: list[str] | None = None,
        allowed_tools: list[str] | None = None,
        http_transport: httpx2.BaseTransport | None = None,
        workspace: str | os.PathLike[str] | None = None,
        max_tool_failures: int | None = None,
        workdir: str | os.PathLike[str] | None = None,
        sandbox: Sandbox | None = None,
        mcp_servers: dict[str, dict[str, Any]] | None = None,
        mcp_connections: McpConnections | None = None,
        provider_health: ProviderHealth | None = None,
        file_access: FileAccess | None = None,
        memory: MemoryStore | None = None,
        **callbacks: Any,
    ) -> None:
        init_agent(
            self,
            model=model,
            provider=provider,
            base_url=base_url,
            api_key=api_key,
            api_mode=api_mode,
            max_iterations=max_iterations,
            enabled_toolsets=enabled_toolsets,
            session_id=session_id,
            home=home,
            stream=stream,
            fallback_providers=fallback_providers,
            source=source,
            yolo=yolo,
            denied_tools=denied_tools,
            allowed_tools=allowed_tools,
            http_transport=http_transport,
            workspace=workspace,
            max_tool_failures=max_tool_failures,
            workdir=workdir,
            sandbox=sandbox,
            mcp_servers=mcp_servers,
            mcp_connections=mcp_connections,
            provider_health=provider_health,
            callbacks=callbacks,
            file_access=file_access,
            memory=memory,
        )

    @property
    def runtime(self) -> ProviderRuntime:
        """The provider talked to now: provider, model, API mode, address (after a failover, a fallback)."""
        return self.provider.runtime

    @property
    def hooks(self) -> Hooks:
        """Register hooks: `agent.hooks.register("pre_tool_call", fn)`."""
        return self.tools.hooks

    @property
    def approvals(self) -> ApprovalPolicy:
        """The approval policy of dangerous commands (`approvals.yolo` may be switched on the fly)."""
        return self.tools.approvals

    @property
    def store(self) -> SessionStore:
        """The session database."""
        return self.session.store

    @property
    def session_id(self) -> str:
        """The session written to now (after a compression, the child session)."""
        return self.session.session_id

    def chat(self, message: str) -> str:
        """Send one message and return the final answer (the simple interface to run_conversation)."""
        return self.run_conversation(message)["final_response"] or ""

    @property
    def history(self) -> tuple[Message, ...]:
        """The session's messages, oldest first: a copy, so reading it can never break the history."""
        return tuple(copy.deepcopy(self.session.history.messages))

    @property
    def tool_schemas(self) -> tuple[ToolSchema, ...]:
        """The tools the model sees: name, description and argument schema of each."""
        self.tools.refresh(wait=False)  # MCP servers may have started (or failed) since
        return tuple(self.tools.schemas)

    def undo_last_turn(self) -> str | None:
        """Forget the last user message and everything after it, in the store too.

        Returns:
            What the user said in that turn, or None when there was nothing to undo.
        """
        return self.session.history.undo_last_turn()
