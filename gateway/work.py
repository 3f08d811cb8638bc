"""What moves through the gateway: a message as a connector hands it over, the job that runs it, and
what the run came to."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mibyan.core.errors import MibyanError
from mibyan.gateway.ledger import InboxEntry
from mibyan.gateway.streaming import AnswerStream

if TYPE_CHECKING:
    from mibyan.agent.messages import Message
    from mibyan.gateway.agents import AgentInstance

Delta = Callable[[str], None]
#: `(phase, tool name, detail)` as AIAgent's tool_progress_callback gives it (on a worker thread).
ToolProgress = Callable[[str, str, dict[str, Any]], None]


class UnknownAgent(MibyanError):
    """A message names an agent the connector does not serve."""


class RunFailed(MibyanError):
    """A run raised on a fault of ours; the gateway's log has its traceback (logged once, by the runner)."""


class NothingToAnswer(MibyanError):
    """An answer (/approve, /deny) for a channel where no question waits: none was asked, or another
    answer was taken first (at another gateway, say)."""


class ShuttingDown(MibyanError):
    """The gateway is stopping and takes no new work."""


@dataclass(frozen=True)
class Inbound:
    """One message as a connector hands it over.

    Attributes:
        agent_id: the agent it is routed to.
        connector: the connector's name.
        channel: the channel's id on that connector; None for a one-off conversation.
        text: the new user message.
        history: for a one-off conversation, the messages before `text`.
        message_key: the connector's message id or the `Idempotency-Key`, when there is one.
    """

    agent_id: str
    connector: str
    channel: str | None
    text: str
    history: list[Message] | None = None
    message_key: str | None = None


@dataclass(frozen=True)
class RunRequest:
    """What a job runs: the message as it arrived, or as the ledger kept it (secrets masked) for one
    resumed after a restart.

    Attributes:
        text: the new user message.
        history: for a one-off conversation, the messages before `text`.
        one_off: a conversation of its own (no channel): it runs in no channel's session.
        approval_answer: it arrived while its channel's run waited for an answer to a question.
    """

    text: str
    history: tuple[Message, ...] | None = None
    one_off: bool = False
    approval_answer: bool = False

    def as_record(self) -> dict[str, Any]:
        """The request as the ledger stores it (JSON)."""
        history = list(self.history) if self.history is not None else None
        return {
            "text": self.text,
            "history": history,
            "one_off": self.one_off,
            "approval_answer": self.approval_answer,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RunRequest:
        """The request the ledger stored (`as_record`); what an older gateway left out is the default."""
        history = record.get("history")
        return cls(
            text=str(record.get("text") or ""),
            history=tuple(history) if isinstance(history, list) else None,
            one_off=bool(record.get("one_off")),
            approval_answer=bool(record.get("approval_answer")),
        )


@dataclass(frozen=True)
class Outcome:
    """What a run came to: the answer (or the failure) and the session it is in."""

    inbox_id: int
    text: str
    session_id: str
    usage: dict[str, int]
    error: str | None = None
    interrupted: bool = False


@dataclass
class Job:
    """One message to run. `request` is what arrived; the ledger's copy has secrets masked, so only a
    message resumed after a restart runs from it."""

    entry: InboxEntry
    request: RunRequest
    agent: AgentInstance
    future: asyncio.Future[Outcome]
    on_delta: Delta | None = None
    on_start: Delta | None = None
    on_tool: ToolProgress | None = None
    session_id: str = ""
    preface: str = ""  # what the reply starts with: a note about the channel's previous run
    stream: AnswerStream | None = None


def channel_key(message: Inbound) -> str:
    """`<agent_id>/<connector>/<channel_id>`, or for a one-off conversation a key of its own.

    One-off conversations never share a key, so they never share a queue, an approval question or an
    `Idempotency-Key`'s reply: with a key, the same conversation repeated gets the same one (`#` and a
    digest of its messages, which no client's channel can spell, as those keys always go on with `/`);
    without, a random one.
    """
    if message.channel is not None:
        return f"{message.agent_id}/{message.connector}/{message.channel}"
    if message.message_key is None:
        return f"{message.agent_id}/{message.connector}#{uuid.uuid4().hex}"
    conversation = json.dumps([message.history, message.text, message.message_key], sort_keys=True)
    return f"{message.agent_id}/{message.connector}#{hashlib.sha256(conversation.encode()).hexdigest()[:32]}"
