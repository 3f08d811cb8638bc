"""The delivery ledger: what arrived on each channel and what was answered, in the session store.

An inbound message is recorded before the connector acknowledges it, keyed per channel by the
connector's message id (or the HTTP `Idempotency-Key`), so a repeat is recognised even across restarts.
A reply is recorded before it is sent and marked when it is, so a restart sends what was pending, never
twice, and never a reply older than `gateway.redeliver_within` (it is marked `stale` instead).

Inbox states: pending (queued) → running (an agent works on it) → answered | failed.
Outbox states: pending (recorded, not yet handed over) → sent | stale.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from agent_state import SessionStore

#: How long finished messages stay in the ledger: a client repeating a request later than this runs it again.
KEEP_FINISHED = 7 * 24 * 3600


@dataclass(frozen=True)
class InboxEntry:
    """One inbound message as the ledger holds it."""

    id: int
    channel: str
    message_key: str | None
    request: dict[str, Any]
    status: str
    session_id: str | None
    history_length: int | None


@dataclass(frozen=True)
class Reply:
    """A recorded reply: the text and what the connector needs to send it again."""

    inbox_id: int
    channel: str
    text: str
    session_id: str
    usage: dict[str, int]
    status: str
    created_at: float


def inbox_entry(row: dict[str, Any]) -> InboxEntry:
    """An inbox row as the typed entry."""
    return InboxEntry(
        id=int(row["id"]),
        channel=str(row["channel"]),
        message_key=row["message_key"],
        request=json.loads(row["request"]),
        status=str(row["status"]),
        session_id=row["session_id"],
        history_length=row["history_length"],
    )


def _reply(row: dict[str, Any]) -> Reply:
    body = json.loads(row["reply"])
    return Reply(
        inbox_id=int(row["inbox_id"]),
        channel=str(row["channel"]),
        text=str(body["text"]),
        session_id=str(body["session_id"]),
        usage=dict(body.get("usage") or {}),
        status=str(row["status"]),
        created_at=float(row["created_at"]),
    )


class Ledger:
    """The inbox and outbox of one session store (its `ledger` and `channels`), as typed entries."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        #: the lease owner of this gateway, where gateways share the store: its replies name it, so no
        #: other gateway sends them while it lives
        self.sender: str | None = None

    def record_inbound(
        self, channel: str, message_key: str | None, request: dict[str, Any], admitted_by: str | None = None
    ) -> tuple[InboxEntry, bool]:
        """Record a message before it is acknowledged (`admitted_by`: this gateway's lease owner).

        Returns:
            The entry, and whether it is new (False: this channel already had this message key).
        """
        row, new = self.store.ledger.record_inbound(
            channel, message_key, json.dumps(request, ensure_ascii=False), admitted_by
        )
        return inbox_entry(row), new

    def mark_running(self, inbox_id: int, session_id: str, history_length: int) -> None:
        """An agent starts on the message; `history_length` is the session's length before its turn."""
        self.store.ledger.mark_running(inbox_id, session_id, history_length)

    def set_status(self, inbox_id: int, status: str) -> None:
        """Set an inbound message's state (failed, say, or answered without a run)."""
        self.store.ledger.set_status(inbox_id, status)

    def record_reply(self, entry: InboxEntry, text: str, session_id: str, usage: dict[str, int]) -> Reply:
        """Record the answer (and close the inbound message) before anything is sent."""
        body = json.dumps({"text": text, "session_id": session_id, "usage": usage}, ensure_ascii=False)
        return _reply(self.store.ledger.record_reply(entry.id, entry.channel, body, self.sender))

    def reply_for(self, inbox_id: int) -> Reply | None:
        """The reply recorded for an inbound message, whatever its delivery state; None before one."""
        row = self.store.ledger.reply(inbox_id)
        return _reply(row) if row else None

    def mark_sent(self, inbox_id: int) -> None:
        """The reply to `inbox_id` has been handed to its connector (a no-op before one is recorded)."""
        self.store.ledger.mark_sent(inbox_id)

    def unfinished(self) -> list[InboxEntry]:
        """Messages that were recorded but not answered (queued or cut off by a stop), oldest first."""
        return [inbox_entry(r) for r in self.store.ledger.unfinished()]

    def undelivered(self, within: float, before: float) -> list[Reply]:
        """Replies recorded before `before` (this run's start) but never sent; those older than `within`
        seconds are marked stale instead (where gateways share the store, whichever recorded them: one
        still sending its reply marks it sent all the same). Where gateways share the store, only the
        replies whose gateway is gone, which are this one's to send from now on."""
        leases = self.store.leases
        if self.sender is None or leases is None:
            return [_reply(r) for r in self.store.ledger.undelivered(time.time() - within, before)]
        self.store.ledger.mark_stale(time.time() - within)
        return [_reply(r) for r in leases.take_undelivered(self.sender, before)]

    def forget_finished(self, older_than: float = KEEP_FINISHED) -> int:
        """Delete messages finished (answered and sent, stale or failed) more than `older_than` seconds
        ago, with their replies; returns how many. Unfinished ones are always kept."""
        return self.store.ledger.forget_finished(time.time() - older_than)

    def channel_session(self, channel: str) -> str | None:
        """The session a channel started (follow its compression lineage for the newest one)."""
        return self.store.channels.first_session(channel)

    def tag_session(self, session_id: str, channel: str) -> None:
        """Mark a session (a compression descendant, say) as the channel's."""
        self.store.channels.tag(session_id, channel)

    def entry(self, inbox_id: int) -> InboxEntry | None:
        """One inbound message by its ledger id (a chat connector re-sending its reply needs its id)."""
        row = self.store.ledger.inbound(inbox_id)
        return inbox_entry(row) if row else None

    def has_message(self, channel: str, message_key: str) -> bool:
        """Whether the channel already recorded this message (a chat platform without send idempotency,
        XMPP, must not admit a re-read message again: its reply would be sent twice)."""
        return self.store.ledger.has_message(channel, message_key)

    def end_channel_session(self, channel: str) -> int:
        """In-chat /new: the channel's sessions stop being its sessions (they stay in the store, titled by
        the channel), so its next message starts a fresh one; returns how many were let go."""
        return self.store.channels.release(channel)
