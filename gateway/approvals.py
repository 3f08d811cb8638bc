"""Approvals over chat (`gateway.approvals: ask`): the question goes to the channel, the channel answers.

When a run wants to do something dangerous, its user is asked in the channel the run belongs to: the
question is the reply to the message being worked on, and the run waits. The channel's next message
answers: `/approve` lets the command run once, `/deny` refuses it, and that message's reply is the run's
final answer. Anything else meanwhile is told to answer first (it does not run). Nobody answering
within `approvals.timeout` seconds denies, and the channel's next reply says so, with what the run
answered then.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

ANSWERS = {"/approve": True, "/deny": False}
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


def timed_out_text(command: str, timeout: float, answer: str) -> str:
    note = f"Nobody approved `{command}` within {timeout:g} s, so it did not run."
    return f"{note}\n\n{answer}" if answer else note


@dataclass
class PendingApproval:
    """One question waiting for its channel's answer.

    Attributes:
        inbox_id: the message whose run asks.
        command: what the run wants to do.
        reason: why that needs approval.
        said: what the run said before it asked (the question's reply starts with it).
        decided: set once answered; `approved` holds the answer.
        result: the future that receives the run's final outcome (whoever answers awaits it).
    """

    inbox_id: int
    session_id: str
    command: str
    reason: str
    said: str = ""
    decided: threading.Event = field(default_factory=threading.Event)
    approved: bool = False
    result: asyncio.Future[Any] | None = None

    def asking_text(self) -> str:
        """The asking message's reply: what the run said before it asked, then the question."""
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

    def answer(self, channel: str, text: str) -> PendingApproval | None:
        """Event loop: apply `text` as the answer; None when it is not an answer (ask to answer first)."""
        word = text.strip().lower()
        pending = self._pending.get(channel)
        if pending is None or word not in ANSWERS:
            return None
        del self._pending[channel]
        pending.approved = ANSWERS[word]
        pending.decided.set()
        return pending

    def expire(self, channel: str, pending: PendingApproval) -> None:
        """Event loop: nobody answered in time (the run was told no); the channel takes messages again."""
        if self._pending.get(channel) is pending:
            del self._pending[channel]

    def note_timeout(self, channel: str, pending: PendingApproval, answer: str) -> None:
        """Event loop: the timed-out run has ended; the channel's next reply starts with what happened."""
        self._notices[channel] = timed_out_text(pending.command, self.timeout, answer)

    def deny_all(self) -> None:
        """Any thread: the gateway is stopping; every waiting run is told no at once."""
        for pending in list(self._pending.values()):
            pending.decided.set()

    def take_notice(self, channel: str) -> str | None:
        return self._notices.pop(channel, None)
