"""The gateway's delivery ledger (inbox and outbox) and which sessions belong to which channel.

The rows as stored; gateway/ledger.py reads them into its own typed entries and says what the states
mean (inbox: pending → running → answered | failed; outbox: pending → sent | stale).
"""

from __future__ import annotations

import time
from typing import Any

from mibyan.core.redact import mask_secrets
from mibyan.store.database import Database, row_dict
from mibyan.store.notices import LEDGER

#: Rows deleted per statement when finished messages are forgotten (SQLite allows 999 parameters).
_CHUNK = 500


class GatewayLedger:
    """The `gateway_inbox` and `gateway_outbox` tables. Texts are stored with their secrets masked."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def record_inbound(
        self, channel: str, message_key: str | None, request: str, admitted_by: str | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Record an inbound message (`request`: its JSON text) unless the channel has its key already;
        `admitted_by` is the lease owner of the gateway taking it, where gateways share the store.

        Returns:
            The inbox row, and whether it is new (False: the row recorded before under that key).
        """
        with self._db.transaction() as db:
            # one statement that yields to a row another process inserts at the same moment (two
            # gateways given one Idempotency-Key): it waits for that insert, then takes its row
            rows = db.execute(
                "INSERT INTO gateway_inbox (channel, message_key, request, received_at, admitted_by)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING *",
                (channel, message_key, mask_secrets(request), time.time(), admitted_by),
            ).fetchall()
            if rows:
                return row_dict(rows[0]), True
            row = db.execute(
                "SELECT * FROM gateway_inbox WHERE channel = ? AND message_key = ?", (channel, message_key)
            ).fetchone()
        return row_dict(row), False

    def mark_running(self, inbox_id: int, session_id: str, history_length: int) -> None:
        with self._db.transaction() as db:
            db.execute(
                "UPDATE gateway_inbox SET status = 'running', session_id = ?, history_length = ?"
                " WHERE id = ?",
                (session_id, history_length, inbox_id),
            )

    def set_status(self, inbox_id: int, status: str) -> None:
        """Set a message's state; one that failed is announced (LEDGER), as whoever waits for its reply
        will have none."""
        with self._db.transaction() as db:
            db.execute("UPDATE gateway_inbox SET status = ? WHERE id = ?", (status, inbox_id))
            if status == "failed":
                self._db.announce(db, LEDGER, str(inbox_id))

    def record_reply(
        self, inbox_id: int, channel: str, reply: str, sender: str | None = None
    ) -> dict[str, Any]:
        """Record the reply (`reply`: its JSON text) unless one is recorded, and mark the inbound
        message answered, in one transaction that announces it (LEDGER); returns the outbox row (the one
        recorded first). `sender` is the lease owner of the gateway sending it, where gateways share
        the store."""
        with self._db.transaction() as db:
            rows = db.execute(
                "INSERT INTO gateway_outbox (inbox_id, channel, reply, created_at, sender)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING RETURNING *",
                (inbox_id, channel, mask_secrets(reply), time.time(), sender),
            ).fetchall()
            if not rows:
                rows = db.execute("SELECT * FROM gateway_outbox WHERE inbox_id = ?", (inbox_id,)).fetchall()
            db.execute("UPDATE gateway_inbox SET status = 'answered' WHERE id = ?", (inbox_id,))
            self._db.announce(db, LEDGER, str(inbox_id))
        return row_dict(rows[0])

    def inbound(self, inbox_id: int) -> dict[str, Any] | None:
        rows = self._db.query("SELECT * FROM gateway_inbox WHERE id = ?", (inbox_id,))
        return row_dict(rows[0]) if rows else None

    def has_message(self, channel: str, message_key: str) -> bool:
        rows = self._db.query(
            "SELECT 1 FROM gateway_inbox WHERE channel = ? AND message_key = ?", (channel, message_key)
        )
        return bool(rows)

    def reply(self, inbox_id: int) -> dict[str, Any] | None:
        rows = self._db.query("SELECT * FROM gateway_outbox WHERE inbox_id = ?", (inbox_id,))
        return row_dict(rows[0]) if rows else None

    def mark_sent(self, inbox_id: int) -> None:
        with self._db.transaction() as db:
            db.execute(
                "UPDATE gateway_outbox SET status = 'sent', sent_at = ?"
                " WHERE inbox_id = ? AND status != 'sent'",
                (time.time(), inbox_id),
            )

    def unfinished(self) -> list[dict[str, Any]]:
        """Inbox rows pending or running, oldest first."""
        rows = self._db.query(
            "SELECT * FROM gateway_inbox WHERE status IN ('pending', 'running') ORDER BY id"
        )
        return [row_dict(r) for r in rows]

    def undelivered(self, recorded_after: float, recorded_before: float) -> list[dict[str, Any]]:
        """Outbox rows still pending that were recorded before `recorded_before` (a run's start: what the
        run records itself, it sends itself), oldest first; those recorded before `recorded_after` are
        marked stale first, and left out. (Gateways sharing the store take theirs with
        Leases.take_undelivered instead.)"""
        self.mark_stale(recorded_after)
        rows = self._db.query(
            "SELECT * FROM gateway_outbox WHERE status = 'pending' AND created_at < ? ORDER BY id",
            (recorded_before,),
        )
        return [row_dict(r) for r in rows]

    def mark_stale(self, recorded_before: float) -> None:
        """Mark the replies still pending that were recorded before `recorded_before` stale: too old to
        send now."""
        with self._db.transaction() as db:
            db.execute(
                "UPDATE gateway_outbox SET status = 'stale' WHERE status = 'pending' AND created_at < ?",
                (recorded_before,),
            )

    def forget_finished(self, received_before: float) -> int:
        """Delete the messages received before `received_before` that are finished (answered and sent,
        stale or failed), with their replies; returns how many."""
        finished = (
            "SELECT i.id FROM gateway_inbox i LEFT JOIN gateway_outbox o ON o.inbox_id = i.id"
            " WHERE i.received_at < ? AND (i.status = 'failed'"
            " OR (i.status = 'answered' AND (o.status IS NULL OR o.status IN ('sent', 'stale'))))"
        )
        with self._db.transaction() as db:
            ids = [row["id"] for row in db.execute(finished, (received_before,)).fetchall()]
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                marks = ", ".join("?" * len(chunk))
                db.execute(f"DELETE FROM gateway_outbox WHERE inbox_id IN ({marks})", chunk)
                db.execute(f"DELETE FROM gateway_inbox WHERE id IN ({marks})", chunk)
        return len(ids)


class Channels:
    """Which sessions are a gateway channel's (the `channel` column of `sessions`, holding the channel's
    key `<agent>/<connector>/<channel>`)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def sessions(self, channel: str) -> list[str]:
        """Every session of the channel."""
        return [
            str(row["id"]) for row in self._db.query("SELECT id FROM sessions WHERE channel = ?", (channel,))
        ]

    def first_session(self, channel: str) -> str | None:
        """The session the channel started (follow its compression lineage for the newest one)."""
        rows = self._db.query(
            "SELECT id FROM sessions WHERE channel = ? ORDER BY created_at LIMIT 1", (channel,)
        )
        return str(rows[0]["id"]) if rows else None

    def tag(self, session_id: str, channel: str) -> None:
        """Mark a session (a compression descendant, say) as the channel's, unless it is another's."""
        with self._db.transaction() as db:
            db.execute(
                "UPDATE sessions SET channel = ? WHERE id = ? AND channel IS NULL", (channel, session_id)
            )

    def release(self, channel: str) -> int:
        """The channel's sessions stop being its (they stay in the store); returns how many."""
        with self._db.transaction() as db:
            cursor = db.execute("UPDATE sessions SET channel = NULL WHERE channel = ?", (channel,))
        return int(cursor.rowcount)

    def count(self) -> int:
        """How many sessions belong to some channel."""
        return int(self._db.query("SELECT count(*) AS n FROM sessions WHERE channel IS NOT NULL")[0]["n"])
