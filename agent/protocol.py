"""The agent as its mixins see each other: one declaration that the type checker holds every mixin to.

Each mixin of `AIAgent` derives from `AgentBase`, which is `AgentCore` for the type checker and plain
`object` at run time. So a mixin that calls another mixin's method, or reads state the constructor set,
is checked against the one declaration here: renaming a phase method leaves `AIAgent` without it (mypy:
"Cannot instantiate abstract class"), and a misspelled attribute is an error where it is written, in a
mixin or in agent_init.py (which takes a typed `AIAgent`).

`AgentCore` is an abstract class rather than a `typing.Protocol`: a class that derives from a Protocol
explicitly must define every attribute the Protocol declares in its own body, and the agent's state is
set by agent_init.py; with an ABC the methods are abstract and the attributes are plain declarations.
The state itself is grouped in typed objects: `provider` (agent/providers.py), `session`
(agent/session.py), `prompt` (agent/prompt_builder.py) and `tools` (agent/tool_executor.py); a run's own
state is its TurnState.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mibyan.agent.adapters.base import NormalizedResponse
    from mibyan.agent.callbacks import Callbacks
    from mibyan.agent.context_engine import ContextEngine
    from mibyan.agent.memory import MemoryStore
    from mibyan.agent.messages import Message, ToolCall
    from mibyan.agent.prompt_builder import PromptState
    from mibyan.agent.providers import ProviderState
    from mibyan.agent.session import SessionHandle
    from mibyan.agent.session_lock import SessionLock
    from mibyan.agent.tokens import TokenEstimator
    from mibyan.agent.tool_executor import ToolRuntime
    from mibyan.agent.turn_state import (
        BudgetExhausted,
        Continue,
        Failed,
        Interrupted,
        PreparedRequest,
        TurnState,
    )
    from mibyan.config.loader import AgentSettings
    from mibyan.core.errors import ProviderError
    from mibyan.core.interruptible import InterruptSignal
    from mibyan.tools.context import FileAccess
    from mibyan.tools.sandbox import Sandbox


class AgentCore(ABC):
    """The state every mixin may read (set once by agent_init.py) and the methods they call on each other."""

    # -- configuration and wiring ------------------------------------------------------------------
    settings: AgentSettings
    home: Path
    callbacks: Callbacks
    sandbox: Sandbox
    # where the persona, memory files, skills and context file come from: the home, or a workspace
    workspace: Path | None
    persona_dir: Path
    # the tools' working directory (relative paths, commands); None: the process's own
    workdir: Path | None
    # what session_search may see: the sessions of this channel key only (None: every session)
    session_scope: str | None
    memory: MemoryStore
    compress_between_turns: bool
    # held while this process runs the session, so no other process opens it meanwhile; close() lets go
    session_lock: SessionLock | None

    # -- the provider: the one talked to now, the primary, the ones that failed lately, the client ---
    provider: ProviderState

    # -- the session, its history and its prompt ----------------------------------------------------
    session: SessionHandle
    prompt: PromptState

    # -- tools and context ----------------------------------------------------------------------------
    tools: ToolRuntime
    _estimator: TokenEstimator
    _window: int
    _context_engine: ContextEngine | None
    # where the file tools read and write text (an editor's buffers); None: the disk
    file_access: FileAccess | None

    # -- running: interrupts, subagents, one conversation at a time -----------------------------------
    _signal: InterruptSignal
    delegation_depth: int
    _children: set[AgentCore]
    _children_lock: threading.Lock
    _running: threading.Lock
    _closed: bool

    # -- methods, by the mixin that has them ----------------------------------------------------------
    # conversation_loop.py
    @abstractmethod
    def interrupt(self) -> None: ...

    @abstractmethod
    def adopt_child(self, child: AgentCore) -> None: ...

    @abstractmethod
    def release_child(self, child: AgentCore) -> None: ...

    # prompt_builder.py
    @abstractmethod
    def _session_system_prompt(self) -> str: ...

    @abstractmethod
    def _message_layers(self, message: str) -> list[str]: ...

    # turn_iteration_prep.py
    @abstractmethod
    def _prepare_iteration(self, turn: TurnState) -> PreparedRequest | Interrupted | BudgetExhausted: ...

    # turn_api_call.py
    @abstractmethod
    def _call_model_once(self, turn: TurnState, request: PreparedRequest) -> NormalizedResponse: ...

    # turn_api_error.py
    @abstractmethod
    def _call_with_retries(
        self, turn: TurnState, request: PreparedRequest
    ) -> NormalizedResponse | Interrupted | Failed: ...

    @abstractmethod
    def _call_without_tools(
        self, turn: TurnState, extra_messages: tuple[Message, ...], notes: tuple[str, ...]
    ) -> NormalizedResponse | Interrupted | Failed: ...

    @abstractmethod
    def _fail_over(self, error: ProviderError) -> bool: ...

    @abstractmethod
    def _restore_primary(self) -> None: ...

    # turn_overflow.py
    @abstractmethod
    def _compress_if_needed(self, turn: TurnState | None, threshold: float, reason: str) -> None: ...

    @abstractmethod
    def _recover_from_overflow(self, turn: TurnState, error: ProviderError) -> ProviderError | None: ...

    # turn_truncation.py
    @abstractmethod
    def _handle_truncation(
        self, turn: TurnState, reply: NormalizedResponse, request: PreparedRequest
    ) -> NormalizedResponse | Continue | Interrupted | Failed: ...

    # turn_recovery.py
    @abstractmethod
    def _check_empty_reply(
        self, turn: TurnState, reply: NormalizedResponse
    ) -> NormalizedResponse | Continue | Failed: ...

    # tool_executor.py
    @abstractmethod
    def _execute_tool_calls(self, turn: TurnState, calls: list[ToolCall]) -> Continue | Interrupted: ...


if TYPE_CHECKING:
    AgentBase = AgentCore
else:
    AgentBase = object
