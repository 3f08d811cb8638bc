"""AIAgent: the public facade of mibyan's agent. The loop and its phases live in the agent/ mixins."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from mibyan.agent.agent_init import init_agent
from mibyan.agent.conversation_loop import ConversationLoopMixin
from mibyan.agent.lifecycle import LifecycleMixin
from mibyan.agent.messages import Message
from mibyan.agent.options import AgentOptions
from mibyan.agent.prompt_builder import PromptBuilderMixin
from mibyan.agent.tool_executor import ToolExecutorMixin
from mibyan.agent.turn_api_call import ApiCallMixin
from mibyan.agent.turn_api_error import ApiErrorMixin
from mibyan.agent.turn_iteration_prep import IterationPrepMixin
from mibyan.agent.turn_overflow import OverflowMixin
from mibyan.agent.turn_recovery import RecoveryMixin
from mibyan.agent.turn_state import ConversationResult
from mibyan.agent.turn_truncation import TruncationMixin
from mibyan.tools.schema import ToolSchema

if TYPE_CHECKING:
    from agent_state import SessionStore
    from mibyan.agent.hooks import Hooks
    from mibyan.agent.providers import ProviderRuntime
    from mibyan.tools.approval import ApprovalPolicy

__all__ = ["AIAgent", "AgentOptions", "ConversationResult"]


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

    Build it from keyword arguments, `AIAgent(model="gpt-4o-mini", stream_delta_callback=print)`, or from
    one `AgentOptions` value, `AIAgent(options=AgentOptions(model="gpt-4o-mini"))`: the same names (see
    `AgentOptions` for each), the callbacks of `agent.callbacks.Callbacks` passed by their names.

    Use it as a context manager (`with AIAgent(...) as agent:`), or call `close()` when done: it holds a
    database connection, HTTP connections and the processes of its MCP servers.

    Raises:
        ConfigError: a broken configuration or a missing key, as one line naming the file and key.
        TypeError: an unknown keyword argument, or `options=` given with keyword arguments beside it.
    """

    def __init__(self, *, options: AgentOptions | None = None, **kwargs: Any) -> None:
        if options is None:
            options = AgentOptions.from_kwargs(kwargs)
        elif not isinstance(options, AgentOptions):
            raise TypeError(f"AIAgent: options must be an AgentOptions, not {type(options).__name__}")
        elif kwargs:
            # one way to say each option: vary an AgentOptions with dataclasses.replace instead
            also = ", ".join(sorted(kwargs))
            raise TypeError(f"AIAgent takes options= or keyword arguments, not both (also given: {also})")
        init_agent(self, options)

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
