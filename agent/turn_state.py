"""The state of one `run_conversation`, and the steps a turn phase can return."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal, TypedDict

from mibyan.agent.adapters.base import Usage
from mibyan.agent.budget import IterationBudget
from mibyan.agent.callbacks import ShownText
from mibyan.agent.messages import History, Message
from mibyan.agent.session import SessionHandle
from mibyan.core.errors import MibyanError
from mibyan.tools.schema import ToolSchema

ExitReason = Literal["completed", "budget_exhausted", "interrupted", "error"]


class ConversationResult(TypedDict):
    """What `run_conversation` (and `continue_turn`) return: a plain dict, with keys the checker knows.

    Attributes:
        final_response: the answer, or None when the turn ended without one.
        messages: the session's history after the turn (a copy).
        session_id: the session written to (after a compression, the child session).
        task_id: the id this turn's tools shared state by.
        api_calls: model calls the turn made.
        completed: exit_reason is "completed".
        interrupted: exit_reason is "interrupted".
        exit_reason: why the turn ended.
        usage: token counts summed over the turn's calls (`input_tokens`, `output_tokens`,
            `cache_read_tokens`, `cache_write_tokens`, `reasoning_tokens`, `total_tokens`).
        error: what failed, when exit_reason is "error"; otherwise None.
    """

    final_response: str | None
    messages: list[Message]
    session_id: str
    task_id: str
    api_calls: int
    completed: bool
    interrupted: bool
    exit_reason: ExitReason
    usage: dict[str, int]
    error: str | None


@dataclass
class TurnState:
    """Everything one run_conversation accumulates: its history, budget, counters and outcome."""

    task_id: str
    session: SessionHandle
    system_prompt: str
    budget: IterationBudget
    api_calls: int = 0
    usage: Usage = field(default_factory=Usage)
    final_response: str | None = None
    exit_reason: ExitReason = "completed"
    error: str | None = None
    tool_failures: dict[str, int] = field(default_factory=dict)
    overflow_recoveries: int = 0
    empty_replies: int = 0
    request_estimate: float = 0.0
    message_layers: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # What the stream callbacks showed of the reply being fetched, across its retries (reset per call).
    shown_text: ShownText = field(default_factory=ShownText)
    shown_reasoning: ShownText = field(default_factory=ShownText)

    @property
    def history(self) -> History:
        """The session's history now (a compression during the turn replaces it)."""
        return self.session.history


@dataclass(frozen=True)
class PreparedRequest:
    """What one model call will send.

    Attributes:
        system_prompt: the session's system prompt, byte-identical from call to call (it is cached).
        history: the stored conversation, as it is now.
        tools: the tools described to the model.
        extra_messages: request-only messages after the history, never stored (the budget-summary
            request, a cut answer and the note asking to continue it).
        notes: ephemeral notes for this call only (matched skills and facts, budget and context
            pressure); they go after the last cache breakpoint, so the cached prefix does not move.
        allow_tool_calls: False when the model may describe but not call tools.
    """

    system_prompt: str
    history: list[Message]
    tools: list[ToolSchema]
    extra_messages: tuple[Message, ...] = ()
    notes: tuple[str, ...] = ()
    allow_tool_calls: bool = True

    @property
    def messages(self) -> list[Message]:
        """The history followed by the request-only messages."""
        return [*self.history, *self.extra_messages]


# The steps. A phase returns one; the loop matches on it.


@dataclass(frozen=True)
class Continue:
    """Tool results were appended: call the model again."""


@dataclass(frozen=True)
class Final:
    """The model answered; the turn is complete."""

    text: str


@dataclass(frozen=True)
class Interrupted:
    """The turn was interrupted; the history is valid and holds nothing of the partial reply."""


@dataclass(frozen=True)
class BudgetExhausted:
    """The iteration budget is spent: one last call without tools summarizes the work."""


@dataclass(frozen=True)
class Failed:
    """The turn cannot go on: the error says why."""

    error: MibyanError


NextStep = Continue | Final | Interrupted | BudgetExhausted | Failed
