"""Facts: what the agent was asked to remember, found again by the words they share with a message."""

from __future__ import annotations

import re
import time

from mibyan.core.redact import mask_secrets
from mibyan.store.database import Database


class Facts:
    """The `facts` table; `owner` keeps a fact to one agent (None: the home's own facts)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def add(self, text: str, *, owner: str | None = None) -> int:
        """Store a fact (secrets masked); returns its id."""
        with self._db.transaction() as db:
            (row,) = db.execute(  # fetchall: the statement runs to its end before COMMIT
                "INSERT INTO facts (text, created_at, owner) VALUES (?, ?, ?) RETURNING id",
                (mask_secrets(text), time.time(), owner),
            ).fetchall()
        return int(row["id"])

    def relevant(self, text: str, limit: int = 5, *, owner: str | None = None) -> list[str]:
        """Facts of `owner` sharing words (of three letters or more) with `text`, most relevant first."""
        words = [w for w in re.findall(r"\w+", text.lower()) if len(w) > 2][:40]
        if not words:
            return []
        dialect = self._db.dialect
        rows = self._db.query(dialect.fact_search(), (dialect.any_words_query(words), owner, limit))
        return [str(r["text"]) for r in rows]
