"""Sessions: their rows (metadata, counters, the end), and the lineage that links them."""

from __future__ import annotations

import time
from typing import Any

from mibyan.core.redact import mask_secrets
from mibyan.store.database import Connection, Database, StoreError, row_dict


def insert_session(db: Connection, session_id: str, meta: dict[str, Any]) -> None:
    """Create a session row unless it exists (meta: parent_id, title, source, model, provider,
    api_mode, system_prompt, cwd, channel)."""
    now = time.time()
    columns = ["id", "created_at", "updated_at", *meta]
    values = [session_id, now, now, *(_masked(v) if k == "system_prompt" else v for k, v in meta.items())]
    placeholders = ", ".join("?" * len(columns))
    db.execute(
        f"INSERT INTO sessions ({', '.join(columns)}) VALUES ({placeholders}) ON CONFLICT DO NOTHING", values
    )


def _masked(value: Any) -> Any:
    return mask_secrets(value) if isinstance(value, str) and value else value


class Sessions:
    """The `sessions` table: one row per session, newest-first listings, renaming, ending, deleting."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def create(self, session_id: str, **meta: Any) -> None:
        """Create a session row (idempotent). meta: parent_id, title, source, model, provider, api_mode,
        system_prompt, cwd, channel."""
        with self._db.transaction() as db:
            insert_session(db, session_id, meta)

    def get(self, session_id: str) -> dict[str, Any] | None:
        """The session's row, or None when there is no such session."""
        rows = self._db.query("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return row_dict(rows[0]) if rows else None

    def resolve_id(self, prefix: str) -> str:
        """The full id of the session `prefix` names (an id or a unique prefix of one)."""
        exact = self._db.query("SELECT id FROM sessions WHERE id = ?", (prefix,))
        if exact:
            return str(exact[0]["id"])
        rows = self._db.query(
            "SELECT id FROM sessions WHERE id LIKE ? ESCAPE '\\' LIMIT 3",
            (prefix.replace("%", "\\%").replace("_", "\\_") + "%",),
        )
        if not rows:
            raise StoreError(f"no session {prefix!r} (see 'mibyan sessions list')")
        if len(rows) > 1:
            raise StoreError(f"session id {prefix!r} is ambiguous: type more of it")
        return str(rows[0]["id"])

    def most_recent(self, source: str | None = None) -> str | None:
        """The session written to last (of `source` only, when given), subagents' left out."""
        if source is not None:
            rows = self._db.query(
                "SELECT id FROM sessions WHERE source = ? ORDER BY updated_at DESC LIMIT 1", (source,)
            )
        else:
            rows = self._db.query(
                "SELECT id FROM sessions WHERE source != 'subagent' ORDER BY updated_at DESC LIMIT 1"
            )
        return str(rows[0]["id"]) if rows else None

    def newest_first(
        self, limit: int = 50, *, offset: int = 0, source: str | None = None
    ) -> list[dict[str, Any]]:
        """Sessions, most recently updated first; `source` keeps those of one source (cli, gateway, ...)."""
        where, params = ("WHERE source = ? ", (source,)) if source else ("", ())
        rows = self._db.query(
            f"SELECT * FROM sessions {where}ORDER BY updated_at DESC LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        return [row_dict(r) for r in rows]

    def started_by(
        self, source: str, *, cwd: str | None = None, limit: int, offset: int = 0
    ) -> list[dict[str, Any]]:
        """Sessions `source` started itself (no compression or subagent child), in `cwd` when given,
        most recently updated first: id, cwd, title, updated_at."""
        where, params = ("AND cwd = ? ", (cwd,)) if cwd else ("", ())
        rows = self._db.query(
            "SELECT id, cwd, title, updated_at FROM sessions WHERE source = ? AND parent_id IS NULL "
            f"{where}ORDER BY updated_at DESC LIMIT ? OFFSET ?",
            (source, *params, limit, offset),
        )
        return [row_dict(r) for r in rows]

    def sources(self) -> list[str]:
        """Every source that has a session (cli, gateway, acp, subagent, ...), sorted."""
        return [str(r["source"]) for r in self._db.query("SELECT DISTINCT source FROM sessions ORDER BY 1")]

    def set_system_prompt(self, session_id: str, prompt: str) -> None:
        with self._db.transaction() as db:
            db.execute(
                "UPDATE sessions SET system_prompt = ? WHERE id = ?", (mask_secrets(prompt), session_id)
            )

    def rename(self, session_id: str, title: str) -> None:
        """Give a session a title (secrets in it masked, like everything stored)."""
        with self._db.transaction() as db:
            db.execute("UPDATE sessions SET title = ? WHERE id = ?", (mask_secrets(title), session_id))

    def end(self, session_id: str, reason: str) -> None:
        """Mark the session ended, with why (a one-shot's outcome, "compressed")."""
        with self._db.transaction() as db:
            db.execute(
                "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ?",
                (time.time(), reason, session_id),
            )

    def add_usage(self, session_id: str, input_tokens: int, output_tokens: int) -> None:
        with self._db.transaction() as db:
            db.execute(
                "UPDATE sessions SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?"
                " WHERE id = ?",
                (input_tokens, output_tokens, session_id),
            )

    def delete(self, session_id: str) -> list[str]:
        """Delete a session with its descendants and all they hold; returns the ids deleted."""
        ids = Lineage(self._db).descendants(session_id)
        with self._db.transaction() as db:
            for sid in reversed(ids):
                db.execute("DELETE FROM messages WHERE session_id = ?", (sid,))
                db.execute("DELETE FROM session_events WHERE session_id = ?", (sid,))
                db.execute("DELETE FROM todos WHERE session_id = ?", (sid,))
                db.execute("DELETE FROM model_calls WHERE session_id = ?", (sid,))
                db.execute("DELETE FROM sessions WHERE id = ?", (sid,))
        return ids


class Lineage:
    """How sessions descend from one another: a compression's child, a subagent's session."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def newest_descendant(self, session_id: str) -> str:
        """Follow compression lineage from `session_id` to its newest descendant."""
        current = session_id
        seen = {current}
        while True:
            rows = self._db.query(
                "SELECT id FROM sessions WHERE parent_id = ? AND source != 'subagent' "
                "ORDER BY created_at DESC LIMIT 1",
                (current,),
            )
            if not rows or rows[0]["id"] in seen:
                return current
            current = str(rows[0]["id"])
            seen.add(current)

    def ancestry(self, session_id: str) -> list[str]:
        """The session and its ancestors, oldest first."""
        chain = [session_id]
        while True:
            rows = self._db.query("SELECT parent_id FROM sessions WHERE id = ?", (chain[0],))
            parent = rows[0]["parent_id"] if rows else None
            if not parent or parent in chain:
                return chain
            chain.insert(0, parent)

    def descendants(self, session_id: str) -> list[str]:
        """The session and every session descending from it."""
        rows = self._db.query(
            "WITH RECURSIVE tree(id) AS (SELECT ? UNION"
            " SELECT s.id FROM sessions s JOIN tree ON s.parent_id = tree.id) SELECT id FROM tree",
            (session_id,),
        )
        return [str(r["id"]) for r in rows]

    def children(self, session_id: str) -> list[dict[str, Any]]:
        """The sessions whose parent is `session_id`, oldest first, each with `compacted` (true: it is
        the parent's continuation after a compression; false: a subagent's session)."""
        rows = self._db.query(
            "SELECT id, title, source, model, message_count, input_tokens, output_tokens, created_at,"
            " updated_at, end_reason, CASE WHEN EXISTS (SELECT 1 FROM session_events e"
            " WHERE e.session_id = sessions.id AND e.kind = 'compressed') THEN 1 ELSE 0 END AS compacted"
            " FROM sessions WHERE parent_id = ? ORDER BY created_at",
            (session_id,),
        )
        return [row_dict(row) for row in rows]
