"""Full-text search over every message ever stored, best first, with a snippet of each hit."""

from __future__ import annotations

from typing import Any

from mibyan.store.database import Database, row_dict


class Search:
    """Search the messages: `store.search("staging", role="user")` gives the hits, best first.

    The backend's dialect turns the words into its query and ranks the hits (SQLite: FTS5 and bm25).
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    def words_query(self, text: str) -> str:
        """The engine's query for `text` (every word required, the last one as a prefix); "" when
        `text` has no words to search for."""
        return self._db.dialect.words_query(text)

    def __call__(
        self,
        query: str,
        *,
        role: str | None = None,
        since: float | None = None,
        session_ids: list[str] | None = None,
        limit: int = 20,
        marks: tuple[str, str] = ("[", "]"),
    ) -> list[dict[str, Any]]:
        """Messages matching `query`, best first, each with a snippet and its session: session_id, seq,
        role, created_at, title, source, snippet, rank.

        `marks` open and close each matched word in the snippet (a page that must tell them from the
        stored text's own brackets passes markers the text cannot contain).
        """
        match = self.words_query(query)
        if not match:
            return []
        sql = self._db.dialect.message_search(
            role=bool(role), since=since is not None, sessions=len(session_ids or ())
        )
        params: list[Any] = [*marks, match]
        if role:
            params.append(role)
        if since is not None:
            params.append(since)
        params.extend(session_ids or ())
        params.append(limit)
        hits = [row_dict(r) for r in self._db.query(sql, params)]
        return self._db.dialect.snippets(hits, query, marks)
