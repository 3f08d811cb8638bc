"""The delivery ledger: what arrived on each channel and what was answered, in state.db.

An inbound message is recorded before the connector acknowledges it, keyed per channel by the
connector's message id (or the HTTP `Idempotency-Key`), so a repeat is recognised even across restarts.
A reply is recorded before it is sent and marked when it is, so a restart sends what was pending, never
twice, and never a reply older than `gateway.redeliver_within` (it is marked `stale` instead).

Inbox states: pending (queued) → running (an agent works on it) → answered | failed.
Outbox states: pending (recorded, not yet handed over) → sent | stale.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from agent_state import SessionStore, mask_secrets

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


def _entry(row: sqlite3.Row) -> InboxEntry:
    return InboxEntry(
        id=int(row["id"]),
        channel=str(row["channel"]),
        message_key=row["message_key"],
        request=json.loads(row["request"]),
        status=str(row["status"]),
        session_id=row["session_id"],
        history_length=row["history_length"],
    )


def _reply(row: sqlite3.Row) -> Reply:
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
    """The inbox and outbox tables of one session store."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store

    def record_inbound(
        self, channel: str, message_key: str | None, request: dict[str, Any]
    ) -> tuple[InboxEntry, bool]:
        """Record a message before it is acknowledged.

        Returns:
            The entry, and whether it is new (False: this channel already had this message key).
        """
        text = mask_secrets(json.dumps(request, ensure_ascii=False))
        with self.store.transaction() as db:
            if message_key is not None:
                row = db.execute(
                    "SELECT * FROM gateway_inbox WHERE channel = ? AND message_key = ?",
                    (channel, message_key),
                ).fetchone()
                if row is not None:
                    return _entry(row), False
            cursor = db.execute(
                "INSERT INTO gateway_inbox (channel, message_key, request, received_at) VALUES (?, ?, ?, ?)",
                (channel, message_key, text, time.time()),
            )
            row = db.execute("SELECT * FROM gateway_inbox WHERE id = ?", (cursor.lastrowid,)).fetchone()
        return _entry(row), True

    def mark_running(self, inbox_id: int, session_id: str, history_length: int) -> None:
        """An agent starts on the message; `history_length` is the session's length before its turn."""
        with self.store.transaction() as db:
            db.execute(
                "UPDATE gateway_inbox SET status = 'running', session_id = ?, history_length = ?"
                " WHERE id = ?",
                (session_id, history_length, inbox_id),
            )

    def set_status(self, inbox_id: int, status: str) -> None:
        """Set an inbound message's state (failed, say, or answered without a run)."""
        with self.store.transaction() as db:
            db.execute("UPDATE gateway_inbox SET status = ? WHERE id = ?", (status, inbox_id))

    def record_reply(self, entry: InboxEntry, text: str, session_id: str, usage: dict[str, int]) -> Reply:
        """Record the answer (and close the inbound message) before anything is sent."""
        now = time.time()
        body = json.dumps({"text": text, "session_id": session_id, "usage": usage}, ensure_ascii=False)
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO gateway_outbox (inbox_id, channel, reply, created_at)"
                " VALUES (?, ?, ?, ?)",
                (entry.id, entry.channel, mask_secrets(body), now),
            )
            db.execute("UPDATE gateway_inbox SET status = 'answered' WHERE id = ?", (entry.id,))
        reply = self.reply_for(entry.id)
        assert reply is not None
        return reply

    def reply_for(self, inbox_id: int) -> Reply | None:
        """The reply recorded for an inbound message, whatever its delivery state; None before one."""
        rows = self.store.query("SELECT * FROM gateway_outbox WHERE inbox_id = ?", (inbox_id,))
        return _reply(rows[0]) if rows else None

    def mark_sent(self, inbox_id: int) -> None:
        """The reply to `inbox_id` has been handed to its connector (a no-op before one is recorded)."""
        with self.store.transaction() as db:
            db.execute(
                "UPDATE gateway_outbox SET status = 'sent', sent_at = ?"
                " WHERE inbox_id = ? AND status != 'sent'",
                (time.time(), inbox_id),
            )

    def unfinished(self) -> list[InboxEntry]:
        """Messages that were recorded but not answered (queued or cut off by a stop), oldest first."""
        rows = self.store.query(
            "SELECT * FROM gateway_inbox WHERE status IN ('pending', 'running') ORDER BY id"
        )
        return [_entry(r) for r in rows]

    def undelivered(self, within: float) -> list[Reply]:
        """Replies recorded but never sent; those older than `within` seconds are marked stale instead."""
        cutoff = time.time() - within
        with self.store.transaction() as db:
            db.execute(
                "UPDATE gateway_outbox SET status = 'stale' WHERE status = 'pending' AND created_at < ?",
                (cutoff,),
            )
        rows = self.store.query("SELECT * FROM gateway_outbox WHERE status = 'pending' ORDER BY id")
        return [_reply(r) for r in rows]

    def forget_finished(self, older_than: float = KEEP_FINISHED) -> int:
        """Delete messages finished (answered and sent, stale or failed) more than `older_than` seconds
        ago, with their replies; returns how many. Unfinished ones are always kept."""
        cutoff = time.time() - older_than
        finished = (
            "SELECT i.id FROM gateway_inbox i LEFT JOIN gateway_outbox o ON o.inbox_id = i.id"
            " WHERE i.received_at < ? AND (i.status = 'failed'"
            " OR (i.status = 'answered' AND (o.status IS NULL OR o.status IN ('sent', 'stale'))))"
        )
        with self.store.transaction() as db:
            ids = [row[0] for row in db.execute(finished, (cutoff,)).fetchall()]
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                db.execute(f"DELETE FROM gateway_outbox WHERE inbox_id IN ({marks})", chunk)
                db.execute(f"DELETE FROM gateway_inbox WHERE id IN ({marks})", chunk)
        return len(ids)

    def channel_session(self, channel: str) -> str | None:
        """The session a channel started (follow its compression lineage for the newest one)."""
        rows = self.store.query(
            "SELECT id FROM sessions WHERE channel = ? ORDER BY created_at LIMIT 1", (channel,)
        )
        return str(rows[0]["id"]) if rows else None

    def tag_session(self, session_id: str, channel: str) -> None:
        """Mark a session (a compression descendant, say) as the channel's."""
        with self.store.transaction() as db:
            db.execute(
                "UPDATE sessions SET channel = ? WHERE id = ? AND channel IS NULL", (channel, session_id)
            )

    def entry(self, inbox_id: int) -> InboxEntry | None:
        """One inbound message by its ledger id (a chat connector re-sending its reply needs its id)."""
        rows = self.store.query("SELECT * FROM gateway_inbox WHERE id = ?", (inbox_id,))
        return _entry(rows[0]) if rows else None

    def has_message(self, channel: str, message_key: str) -> bool:
        """Whether the channel already recorded this message (a chat platform without send idempotency,
        XMPP, must not admit a re-read message again: its reply would be sent twice)."""
        rows = self.store.query(
            "SELECT 1 FROM gateway_inbox WHERE channel = ? AND message_key = ?", (channel, message_key)
        )
        return bool(rows)

    def end_channel_session(self, channel: str) -> int:
        """In-chat /new: the channel's sessions stop being its sessions (they stay in the store, titled by
        the channel), so its next message starts a fresh one; returns how many were let go."""
        with self.store.transaction() as db:
            cursor = db.execute("UPDATE sessions SET channel = NULL WHERE channel = ?", (channel,))
        return int(cursor.rowcount)
