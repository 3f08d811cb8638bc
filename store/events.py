"""What happened to a session besides its messages: events (a provider switch, a compression, an
approval) and the tokens of each model call."""

from __future__ import annotations

import time
from typing import Any

from mibyan.core.redact import mask_secrets
from mibyan.store.database import Database, row_dict

_CALL_TOKENS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


class Events:
    """The `session_events` and `model_calls` tables."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def record(self, session_id: str, kind: str, detail: str) -> None:
        """Note something that happened to a session (a provider switch, a compression)."""
        with self._db.transaction() as db:
            db.execute(
                "INSERT INTO session_events (session_id, created_at, kind, detail) VALUES (?, ?, ?, ?)",
                (session_id, time.time(), kind, mask_secrets(detail)),
            )

    def of(self, session_id: str) -> list[dict[str, Any]]:
        """The session's events, oldest first: kind, detail, created_at."""
        rows = self._db.query(
            "SELECT kind, detail, created_at FROM session_events WHERE session_id = ? ORDER BY id",
            (session_id,),
        )
        return [row_dict(r) for r in rows]

    def record_model_call(self, session_id: str, model: str, usage: dict[str, int]) -> None:
        """Note the tokens of one model call of a session (usage as `Usage.as_dict()` gives it)."""
        with self._db.transaction() as db:
            db.execute(
                "INSERT INTO model_calls (session_id, seq, model, input_tokens, output_tokens,"
                " cache_read_tokens, cache_write_tokens, reasoning_tokens, created_at)"
                " SELECT id, message_count, ?, ?, ?, ?, ?, ?, ? FROM sessions WHERE id = ?",
                (
                    model,
                    *(int(usage.get(key) or 0) for key in _CALL_TOKENS),
                    time.time(),
                    session_id,
                ),
            )

    def model_calls(self, session_id: str) -> list[dict[str, Any]]:
        """The session's model calls, oldest first: seq, model, created_at and the token counts; none
        from a database an older mibyan wrote, without the table (a reader never migrates)."""
        if not self._db.query(self._db.dialect.table_exists(), ("model_calls",)):
            return []
        rows = self._db.query(
            f"SELECT seq, model, created_at, {', '.join(_CALL_TOKENS)} FROM model_calls"
            " WHERE session_id = ? ORDER BY id",
            (session_id,),
        )
        return [row_dict(r) for r in rows]
