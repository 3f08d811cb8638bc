"""Where a message cut off by a crash or a stop left its turn, so the next start goes on from there.

The turn's calls and results are stored as they land, so the session holds what already ran: the rerun
continues that turn (`AIAgent.continue_turn`) instead of taking it back and running its tools again. A
call that was running when the process died has been answered "interrupted: no result" by the repair
on open; it is never run a second time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agent_state import mask_secrets
from mibyan.gateway.ledger import InboxEntry
from mibyan.gateway.work import RunRequest

if TYPE_CHECKING:
    from mibyan.agent.messages import Message
    from mibyan.gateway.agents import AgentInstance


def cut_turn_start(entry: InboxEntry, session_id: str, history: Sequence[Message]) -> int | None:
    """The index of the entry's user message in `history` when its turn is the session's last one.

    Only a message that started (`running`) or failed under its id has a turn to go on with: `pending`
    never reached the agent. None when the turn did not get as far as storing its user message, or
    when the channel has moved on since (a failed message asked again after later ones were answered
    is a new turn).

    Args:
        entry: the message as the ledger holds it (its session and the history's length when it began).
        session_id: the session the agent opened (a compression during the turn moves it to a child).
        history: that session's messages.
    """
    if entry.status not in ("running", "failed") or entry.history_length is None or entry.session_id is None:
        return None
    users = [index for index, message in enumerate(history) if message["role"] == "user"]
    if not users:
        return None
    last = users[-1]
    if session_id == entry.session_id:
        return last if last == entry.history_length else None
    # compressed during the turn: the child holds the turn's user message last, if it got that far
    said = history[last]["content"]
    same = mask_secrets(str(said)) == mask_secrets(RunRequest.from_record(entry.request).text)
    return last if same else None


def not_to_resume(entry: InboxEntry, instance: AgentInstance | None) -> str | None:
    """Why a message the last run left unanswered is not run at this start (None: it is)."""
    if instance is None:
        return "its agent is no longer configured"
    request = RunRequest.from_record(entry.request)
    if request.approval_answer:
        return "the question it answered died with the last run"
    if entry.message_key is None:
        # only HTTP has messages without an id: its client collects a reply by repeating the request
        # with the same key, and was told to repeat it; without a key the repeat is a new message, and
        # the turn run here too would be run twice (its answer to nobody)
        return "a request without an Idempotency-Key, whose reply nobody can collect (its client repeats it)"
    return None
