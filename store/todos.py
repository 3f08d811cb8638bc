"""Todos: a session's task list, replaced whole each time the agent writes it."""

from __future__ import annotations

from typing import Any

from mibyan.core.redact import mask_secrets
from mibyan.store.database import Database


class Todos:
    """The `todos` table: each session's list, in order."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def get(self, session_id: str) -> list[dict[str, Any]]:
        """The session's todos in order: id (from 1), text, status."""
        rows = self._db.query(
            "SELECT text, status FROM todos WHERE session_id = ? ORDER BY position", (session_id,)
        )
        return [{"id": i + 1, "text": r["text"], "status": r["status"]} for i, r in enumerate(rows)]

    def save(self, session_id: str, items: list[dict[str, Any]]) -> None:
        """Make `items` (each with text and status) the session's list."""
        with self._db.transaction() as db:
            db.execute("DELETE FROM todos WHERE session_id = ?", (session_id,))
            db.executemany(
                "INSERT INTO todos (session_id, position, text, status) VALUES (?, ?, ?, ?)",
                [(session_id, i, mask_secrets(t["text"]), t["status"]) for i, t in enumerate(items)],
            )
