"""Questions over chat: approvals (`gateway.approvals: ask`) and the model's `clarify`, asked in the channel.

When a run wants to do something dangerous, its user is asked in the channel the run belongs to: the
question is the reply to the message being worked on, and the run waits. The channel's next message
answers: `/approve` lets the command run once, `/deny` refuses it, and that message's reply is the run's
final answer. Anything else meanwhile is told to answer first (it does not run). Nobody answering
within `approvals.timeout` seconds denies, and the channel's next reply says so, with what the run
answered then. A `clarify` question goes the same way, and whatever the channel's next message says is
its answer. A run and its subagents ask one question at a time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from mibyan.tools.approval import Answer, ApprovalRequest

ANSWERS = {"/approve": True, "/deny": False}


def answers(pending_kind: str, text: str) -> bool:
    """Whether `text` answers a question of that kind (an approval: /approve or /deny; clarify: anything)."""
    return pending_kind == "clarify" or text.strip().lower() in ANSWERS


#: Why a dangerous command was refused without asking: the gateway's policy, or no channel to ask in.
DENIED_BY_POLICY = "this gateway does not run dangerous commands (gateway.approvals: deny)"
NO_CHANNEL_TO_ASK = (
    "this gateway asks before dangerous commands only in a channel, and this conversation has none "
    "(send the X-Mibyan-Channel header or `user` to be asked)"
)


def question_text(command: str, reason: str) -> str:
    return (
        f"Before going on I need your approval to run a command that {reason}:\n\n    {command}\n\n"
        "Answer /approve to let it run once, or /deny."
    )


def answer_first_text(command: str) -> str:
    return f"Answer /approve or /deny first: I am waiting to know whether I may run `{command}`."


def clarify_text(question: str, choices: tuple[str, ...]) -> str:
    offered = f"\n\n(for example: {', '.join(choices)})" if choices else ""
    return f"{question}{offered}\n\nYour next message is my answer."


def timed_out_text(pending: PendingApproval, timeout: float, answer: str) -> str:
    if pending.kind == "clarify":
        note = f"Nobody answered my question within {timeout:g} s, so I went on without an answer."
    else:
        note = f"Nobody approved `{pending.command}` within {timeout:g} s, so it did not run."
    return f"{note}\n\n{answer}" if answer else note


@dataclass
class PendingApproval:
    """One question waiting for its channel's answer.

    Attributes:
        inbox_id: the message whose run asks.
        command: what the run wants to do (for `clarify`, the model's question).
        reason: why that needs approval (for `clarify`, nothing).
        said: what the run said before it asked (the question's reply starts with it).
        kind: an approval (answered /approve or /deny) or the model's `clarify` (answered in words).
        choices: the answers a `clarify` question offers.
        decided: set once answered; `approved` holds the answer, `answer` a clarify's words.
        result: the future that receives the run's final outcome (whoever answers awaits it).
        question_id: its row in a store shared with other gateways (gateway/elsewhere.py), if any.
        answering: an answer that arrived here is being taken on that row.
    """

    inbox_id: int
    session_id: str
    command: str
    reason: str
    said: str = ""
    kind: Literal["approval", "clarify"] = "approval"
    choices: tuple[str, ...] = ()
    decided: threading.Event = field(default_factory=threading.Event)
    approved: bool = False
    answer: str = ""
    result: asyncio.Future[Any] | None = None
    question_id: int | None = None
    answering: bool = False

    def asking_text(self) -> str:
        """The asking message's reply: what the run said before it asked, then the question."""
        if self.kind == "clarify":
            question = clarify_text(self.command, self.choices)
        else:
            question = question_text(self.command, self.reason)
        return f"{self.said}\n\n{question}" if self.said else question


class ChannelApprovals:
    """The questions waiting for an answer, one per channel at most (a channel runs one turn at a time)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._pending: dict[str, PendingApproval] = {}
        self._notices: dict[str, str] = {}

    def pending(self, channel: str) -> PendingApproval | None:
        return self._pending.get(channel)

    def ask(self, channel: str, pending: PendingApproval) -> None:
        """Event loop: the question is out; the channel's next message answers it."""
        self._pending[channel] = pending

    def pending_questions(self) -> list[PendingApproval]:
        return list(self._pending.values())

    def answer(self, channel: str, text: str) -> PendingApproval | None:
        """Event loop: apply `text` as the answer; None when it is not an answer (ask to answer first)."""
        word = text.strip().lower()
        pending = self._pending.get(channel)
        if pending is None or (pending.kind == "approval" and word not in ANSWERS):
            return None
        del self._pending[channel]
        if pending.kind == "clarify":
            pending.answer = text.strip()
        else:
            pending.approved = ANSWERS[word]
        pending.decided.set()
        return pending

    def expire(self, channel: str, pending: PendingApproval) -> None:
        """Event loop: nobody answered in time (the run was told no); the channel takes messages again."""
        if self._pending.get(channel) is pending:
            del self._pending[channel]

    def note_timeout(
        self, channel: str, pending: PendingApproval, answer: str, timeout: float | None = None
    ) -> None:
        """Event loop: the timed-out run has ended; the channel's next reply starts with what happened
        (`timeout`: the channel's own, where its connector sets one)."""
        self._notices[channel] = timed_out_text(pending, timeout or self.timeout, answer)

    def deny_all(self) -> None:
        """Any thread: the gateway is stopping; every waiting run is told no at once."""
        for pending in list(self._pending.values()):
            pending.decided.set()

    def take_notice(self, channel: str) -> str | None:
        return self._notices.pop(channel, None)


class ChannelAsker:
    """What one run (and its subagents) asks its channel: approvals and `clarify` questions, one at a time.

    Its methods are the run's `approval_callback` and `clarify_callback`; they run on the run's threads
    and wait. A question not out before the timeout (another was) is never posted.

    Args:
        timeout: seconds a question waits for its answer (`approvals.timeout`).
        new: makes the question (kind, text, reason, choices) as the run stands when it is posted.
        post: hands the question to the event loop (the asking message's reply becomes it).
        expire: tells the event loop nobody answered in time.
    """

    def __init__(
        self,
        timeout: float,
        *,
        new: Callable[[Literal["approval", "clarify"], str, str, tuple[str, ...]], PendingApproval],
        post: Callable[[PendingApproval], object],
        expire: Callable[[PendingApproval], object],
    ) -> None:
        self.timeout = timeout
        self._new, self._post, self._expire = new, post, expire
        self._one_at_a_time = threading.Lock()

    def approve(self, request: ApprovalRequest) -> Answer:
        """The approval callback: "once" when the channel answers /approve, else "deny"."""
        pending = self._ask("approval", request.subject, request.reason, ())
        return "once" if pending is not None and pending.approved else "deny"

    def clarify(self, question: str, choices: list[str] | None = None) -> str:
        """The clarify callback: the channel's next message, or what happened instead."""
        offered = tuple(str(choice) for choice in choices or ())
        pending = self._ask("clarify", question, "", offered)
        if pending is None:
            return f"Nobody answered within {self.timeout:g} s. Go on with your best judgement and say so."
        return pending.answer

    def _ask(
        self, kind: Literal["approval", "clarify"], text: str, reason: str, choices: tuple[str, ...]
    ) -> PendingApproval | None:
        """Post one question and wait for it; None when nobody answered in time."""
        deadline = time.monotonic() + self.timeout
        if not self._one_at_a_time.acquire(timeout=self.timeout):
            return None
        try:
            pending = self._new(kind, text, reason, choices)
            self._post(pending)
            if pending.decided.wait(max(0.0, deadline - time.monotonic())):
                return pending
            self._expire(pending)
            return None
        finally:
            self._one_at_a_time.release()
