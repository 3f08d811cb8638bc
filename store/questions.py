"""The questions runs ask their channels (approvals, `clarify`), when several gateways share the store.

A run asks in its channel and waits in its own gateway's process; the channel's answer may arrive at
another gateway (DESIGN §16). So the question is a row: the gateway whose run asks writes it (`ask`),
whichever gateway receives the answer records it on the row still open (`answer`, announced as
QUESTIONS, as its closing is), and the asking gateway, woken, hands it to its run. The answer is taken
by one update of the row it checks, so of two answers arriving at once at two gateways exactly one
counts.

States: open → answered (an answer was taken) | closed (nobody answered in time, or the run ended).
"""

from __future__ import annotations

import time
from typing import Any

from mibyan.core.redact import mask_secrets
from mibyan.store.database import Database, row_dict
from mibyan.store.notices import QUESTIONS


class Questions:
    """The `gateway_questions` table (PostgreSQL stores only)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def ask(
        self,
        channel: str,
        inbox_id: int,
        owner: str,
        *,
        kind: str,
        subject: str,
        asking: str,
        session_id: str,
    ) -> int:
        """Record the question the run of `inbox_id` asks its channel (an earlier one left open there,
        by a gateway that stopped, is closed); its id. `subject`: the command to approve, or the model's
        question; `asking`: the asking message's reply, which states it."""
        with self._db.transaction() as db:
            db.execute(
                "UPDATE gateway_questions SET status = 'closed' WHERE channel = ? AND status = 'open'",
                (channel,),
            )
            row = db.execute(
                "INSERT INTO gateway_questions (channel, inbox_id, owner, kind, subject, asking, session_id,"
                " asked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (
                    channel,
                    inbox_id,
                    owner,
                    kind,
                    mask_secrets(subject),
                    mask_secrets(asking),
                    session_id,
                    time.time(),
                ),
            ).fetchone()
        return int(row["id"])

    def open_on(self, channel: str) -> dict[str, Any] | None:
        """The channel's open question, or None."""
        rows = self._db.query(
            "SELECT * FROM gateway_questions WHERE channel = ? AND status = 'open'", (channel,)
        )
        return row_dict(rows[0]) if rows else None

    def get(self, question_id: int) -> dict[str, Any] | None:
        rows = self._db.query("SELECT * FROM gateway_questions WHERE id = ?", (question_id,))
        return row_dict(rows[0]) if rows else None

    def answer(self, question_id: int, text: str, answer_inbox_id: int) -> bool:
        """Take `text` (the message `answer_inbox_id`) as the answer unless the question was answered or
        closed meanwhile; whether it was taken. Announced to the asking gateway."""
        with self._db.transaction() as db:
            rows = db.execute(
                "UPDATE gateway_questions SET status = 'answered', answer = ?, answer_inbox_id = ?"
                " WHERE id = ? AND status = 'open' RETURNING channel",
                (mask_secrets(text), answer_inbox_id, question_id),
            ).fetchall()
            if rows:
                self._db.announce(db, QUESTIONS, str(rows[0]["channel"]))
        return bool(rows)

    def close(self, question_id: int) -> bool:
        """Nobody may answer it any more (it timed out, or its run ended); False when it was answered."""
        with self._db.transaction() as db:
            rows = db.execute(
                "UPDATE gateway_questions SET status = 'closed' WHERE id = ? AND status = 'open'"
                " RETURNING channel",
                (question_id,),
            ).fetchall()
            if rows:  # its watcher stops watching
                self._db.announce(db, QUESTIONS, str(rows[0]["channel"]))
        return bool(rows)
