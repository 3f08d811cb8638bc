"""SessionStore: every session and message in SQLite, with lineage and full-text search.

One database, `$MIBYAN_HOME/state.db` (the home 0700, the file 0600), in WAL mode so a REPL and a
one-shot run can write at once. Each message is one INSERT when it becomes final, with the session's
counters updated in the same transaction; nothing rewrites a session except an explicit history repair.
An FTS5 index, kept in sync by triggers, makes every word ever said searchable with bm25 ranking.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mibyan.agent.errors import MibyanError
from mibyan.agent.redact import mask_secrets
from mibyan.agent.store_schema import APPLIED_TABLE, MIGRATIONS, NUMBERED, Migration
from mibyan.config.paths import private_dir

if TYPE_CHECKING:
    from mibyan.agent.messages import Message

__all__ = ["SessionSink", "SessionStore", "StoreError", "mask_secrets", "title_from"]


class StoreError(MibyanError):
    """The session database cannot be used (corrupt, unreadable, locked for too long) or an id is unknown."""


def _masked(value: str | None) -> str | None:
    return mask_secrets(value) if value else value


def _row_to_message(row: sqlite3.Row) -> Message:
    # A row holds the fields of its role only (each was written from a message of that role).
    message: dict[str, Any] = {"role": row["role"], "content": row["content"]}
    if row["tool_calls"]:
        message["tool_calls"] = json.loads(row["tool_calls"])
    if row["tool_call_id"]:
        message["tool_call_id"] = row["tool_call_id"]
    if row["name"]:
        message["name"] = row["name"]
    if row["reasoning"]:
        message["reasoning"] = row["reasoning"]
    if row["provider_data"]:
        message["provider_data"] = json.loads(row["provider_data"])
    return cast("Message", message)


def _masked_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls with their arguments masked (as the JSON text they are, before they are nested)."""
    masked = []
    for call in calls:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call = {**call, "function": {**function, "arguments": mask_secrets(arguments)}}
        masked.append(call)
    return masked


def _message_values(session_id: str, seq: int, typed: Message, now: float) -> tuple[Any, ...]:
    message: Mapping[str, Any] = typed  # one column per field, whichever role has it
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        content = json.dumps(content, ensure_ascii=False)
    tool_calls = message.get("tool_calls")
    provider_data = message.get("provider_data")
    return (
        session_id,
        seq,
        message["role"],
        _masked(content),
        json.dumps(_masked_calls(tool_calls), ensure_ascii=False) if tool_calls else None,
        message.get("tool_call_id"),
        message.get("name"),
        _masked(message.get("reasoning")),
        json.dumps(provider_data, ensure_ascii=False) if provider_data else None,
        now,
    )


_INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, seq, role, content, tool_calls, tool_call_id, name, reasoning,"
    " provider_data, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def fts_query(text: str) -> str:
    """A user's words as an FTS5 query: each word must appear (prefix match on the last one)."""
    words = re.findall(r"\w+", text, flags=re.UNICODE)
    if not words:
        return ""
    quoted = [f'"{w}"' for w in words]
    quoted[-1] += "*"
    return " ".join(quoted)


def _insert_session(db: sqlite3.Connection, session_id: str, meta: dict[str, Any]) -> None:
    now = time.time()
    columns = ["id", "created_at", "updated_at", *meta]
    values = [session_id, now, now, *(_masked(v) if k == "system_prompt" else v for k, v in meta.items())]
    placeholders = ", ".join("?" * len(columns))
    db.execute(f"INSERT OR IGNORE INTO sessions ({', '.join(columns)}) VALUES ({placeholders})", values)


_DEFAULT_BUSY_TIMEOUT = 5.0
_CALL_TOKENS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)


def _busy_timeout_from_environment() -> float:
    raw = os.environ.get("MIBYAN_BUSY_TIMEOUT")
    if not raw:
        return _DEFAULT_BUSY_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        raise StoreError(f"MIBYAN_BUSY_TIMEOUT: {raw!r} is not a number of seconds") from None
    if not 0 <= seconds <= 3600:
        raise StoreError(f"MIBYAN_BUSY_TIMEOUT: {raw!r} is not between 0 and 3600 seconds")
    return seconds


class SessionStore:
    """The session database. Thread-safe; several processes may use one file at once.

    Args:
        path: the database file (created 0600, its folder 0700).
        read_only: open for reading only (a home that cannot be written).
        busy_timeout: seconds one attempt waits for another process's write lock (three attempts, then
            a StoreError); `$MIBYAN_BUSY_TIMEOUT`, else 5, when omitted.

    Raises:
        StoreError: the file is corrupt, not a database, or cannot be opened; it is never overwritten.
    """

    def __init__(self, path: Path, *, read_only: bool = False, busy_timeout: float | None = None) -> None:
        self.path = path
        self.read_only = read_only
        self._busy_timeout = busy_timeout if busy_timeout is not None else _busy_timeout_from_environment()
        self._lock = threading.RLock()
        try:
            self._db = self._connect_read_only() if read_only else self._connect()
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{path}: cannot use the session database ({exc}); it was left untouched"
            ) from None
        except OSError as exc:
            raise StoreError(f"{path}: cannot open the session database ({exc.strerror or exc})") from None

    def _connect(self) -> sqlite3.Connection:
        private_dir(self.path.parent)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        wait = self._busy_timeout
        self._db = sqlite3.connect(self.path, timeout=wait, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute("PRAGMA foreign_keys = ON")
        self._retry_while_locked(self._enable_wal)
        self._migrate()
        return self._db

    def _connect_read_only(self) -> sqlite3.Connection:
        """Open for reading only (a home that cannot be written): nothing is created, migrated or changed.

        A WAL database needs its -shm file to be read; where none can be created (a read-only file
        system), the file is opened as immutable, which is safe because nothing can write it either.
        """
        if not self.path.is_file():
            raise StoreError(f"{self.path}: there is no session database yet, and the home is read-only")
        last: sqlite3.DatabaseError | None = None
        for options in ("mode=ro", "immutable=1"):
            uri = f"{self.path.resolve().as_uri()}?{options}"
            db = sqlite3.connect(uri, uri=True, timeout=5.0, check_same_thread=False, isolation_level=None)
            db.row_factory = sqlite3.Row
            try:
                db.execute("SELECT count(*) FROM sessions").fetchone()
                return db
            except sqlite3.DatabaseError as exc:
                db.close()
                last = exc
        assert last is not None
        raise last

    @classmethod
    def open(cls, home: Path, *, busy_timeout: float | None = None) -> SessionStore:
        private_dir(home)
        return cls(home / "state.db", busy_timeout=busy_timeout)

    @classmethod
    def open_for_reading(cls, home: Path) -> SessionStore:
        """The store for commands that only read: read-only when the home or the database is not writable."""
        path = home / "state.db"
        if not home.exists() or (
            os.access(home, os.W_OK) and (not path.exists() or os.access(path, os.W_OK))
        ):
            return cls.open(home)
        return cls(path, read_only=True)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retry_while_locked(self, action: Callable[[], object], attempts: int = 40) -> None:
        """Run `action`, retrying with jitter while another process holds a lock SQLite won't wait on."""
        for attempt in range(attempts):
            try:
                action()
                return
            except sqlite3.OperationalError as exc:
                if ("locked" not in str(exc) and "busy" not in str(exc)) or attempt == attempts - 1:
                    raise
                time.sleep(0.02 * min(attempt + 1, 10) + random.uniform(0, 0.03))

    def _enable_wal(self) -> None:
        # Switching a new database to WAL takes a lock that the busy timeout does not cover, so two
        # processes starting at once on a fresh home would see "database is locked" without retries.
        if self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self._db.execute("PRAGMA journal_mode = WAL")

    def _migrate(self) -> None:
        if not self._pending_migrations(self._db):
            return
        with self._transaction() as db:
            # Read again under the write lock: another process may have migrated meanwhile.
            for step in self._pending_migrations(db):
                step(db)
                db.execute(
                    f"INSERT INTO {APPLIED_TABLE} (name, applied_at) VALUES (?, ?)",
                    (step.__name__, time.time()),
                )
            # Older mibyan versions read user_version: tell them the numbered migrations are all there.
            db.execute(f"PRAGMA user_version = {len(NUMBERED)}")

    @staticmethod
    def _pending_migrations(db: sqlite3.Connection) -> list[Migration]:
        """The registered migrations this database has not had, in their order."""
        try:
            applied = {row[0] for row in db.execute(f"SELECT name FROM {APPLIED_TABLE}")}
        except sqlite3.OperationalError:  # no table yet: a new database, or one numbered by user_version
            if not db.in_transaction:
                return list(MIGRATIONS)
            db.execute(f"CREATE TABLE {APPLIED_TABLE} (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
            numbered = db.execute("PRAGMA user_version").fetchone()[0]
            applied = set(NUMBERED[:numbered])
            db.executemany(
                f"INSERT INTO {APPLIED_TABLE} (name, applied_at) VALUES (?, ?)",
                [(name, time.time()) for name in sorted(applied)],
            )
        return [step for step in MIGRATIONS if step.__name__ not in applied]

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE with retries and jitter while another process holds the write lock.

        Whatever fails inside (or at COMMIT: a full disk, an I/O error) rolls the whole transaction back
        and is one StoreError: nothing is ever written half.
        """
        with self._lock:
            try:
                # The busy timeout waits per attempt; a few attempts give a clear error, not a hang.
                self._retry_while_locked(lambda: self._db.execute("BEGIN IMMEDIATE"), attempts=3)
            except sqlite3.DatabaseError as exc:
                raise StoreError(self._write_failure(exc)) from None
            try:
                yield self._db
                self._db.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                self._rollback()
                raise StoreError(self._write_failure(exc)) from None
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        if not self._db.in_transaction:
            return  # SQLite already rolled back (it does on some I/O errors)
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.DatabaseError as exc:  # the original failure is what the user needs to see
            logging.getLogger("mibyan.store").warning("rollback failed: %s", exc)

    def _write_failure(self, exc: sqlite3.DatabaseError) -> str:
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and ("disk" in text or "I/O" in text):
            return f"{self.path}: cannot save: the disk is full or not writable ({text}); nothing was saved"
        if "readonly" in text or self.read_only:
            return f"{self.path}: cannot save: the database is read-only ({text})"
        return f"{self.path}: {text}"

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """A write transaction (BEGIN IMMEDIATE) for tables other modules own, such as the gateway's."""
        return self._transaction()

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        """Rows of one read query; StoreError when the database fails."""
        return self._query(sql, params)

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._db.execute(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"{self.path}: {exc}") from None

    # -- sessions ---------------------------------------------------------------------------------

    def create_session(self, session_id: str, **meta: Any) -> None:
        """Create a session row (idempotent). meta: parent_id, title, source, model, provider, api_mode,
        system_prompt, cwd."""
        with self._transaction() as db:
            _insert_session(db, session_id, meta)

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return dict(rows[0]) if rows else None

    def resolve_id(self, prefix: str) -> str:
        """The full id of the session `prefix` names (an id or a unique prefix of one)."""
        exact = self._query("SELECT id FROM sessions WHERE id = ?", (prefix,))
        if exact:
            return str(exact[0]["id"])
        rows = self._query(
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
            rows = self._query(
                "SELECT id FROM sessions WHERE source = ? ORDER BY updated_at DESC LIMIT 1", (source,)
            )
        else:
            rows = self._query(
                "SELECT id FROM sessions WHERE source != 'subagent' ORDER BY updated_at DESC LIMIT 1"
            )
        return str(rows[0]["id"]) if rows else None

    def newest_descendant(self, session_id: str) -> str:
        """Follow compression lineage from `session_id` to its newest descendant."""
        current = session_id
        seen = {current}
        while True:
            rows = self._query(
                "SELECT id FROM sessions WHERE parent_id = ? AND source != 'subagent' "
                "ORDER BY created_at DESC LIMIT 1",
                (current,),
            )
            if not rows or rows[0]["id"] in seen:
                return current
            current = str(rows[0]["id"])
            seen.add(current)

    def lineage(self, session_id: str) -> list[str]:
        """The session and its ancestors, oldest first."""
        chain = [session_id]
        while True:
            rows = self._query("SELECT parent_id FROM sessions WHERE id = ?", (chain[0],))
            parent = rows[0]["parent_id"] if rows else None
            if not parent or parent in chain:
                return chain
            chain.insert(0, parent)

    def channel_sessions(self, channel: str) -> list[str]:
        """The sessions of a gateway channel (its key `<agent>/<connector>/<channel>`)."""
        return [row["id"] for row in self._query("SELECT id FROM sessions WHERE channel = ?", (channel,))]

    def list_sessions(
        self, limit: int = 50, *, offset: int = 0, source: str | None = None
    ) -> list[dict[str, Any]]:
        """Sessions, most recently updated first; `source` keeps those of one source (cli, gateway, ...)."""
        where, params = ("WHERE source = ? ", (source,)) if source else ("", ())
        rows = self._query(
            f"SELECT * FROM sessions {where}ORDER BY updated_at DESC LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        return [dict(r) for r in rows]

    def set_system_prompt(self, session_id: str, prompt: str) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE sessions SET system_prompt = ? WHERE id = ?", (mask_secrets(prompt), session_id)
            )

    def rename(self, session_id: str, title: str) -> None:
        """Give a session a title (secrets in it masked, like everything stored)."""
        with self._transaction() as db:
            db.execute("UPDATE sessions SET title = ? WHERE id = ?", (mask_secrets(title), session_id))

    def end_session(self, session_id: str, reason: str) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE sessions SET ended_at = ?, end_reason = ? WHERE id = ?",
                (time.time(), reason, session_id),
            )

    def add_usage(self, session_id: str, input_tokens: int, output_tokens: int) -> None:
        with self._transaction() as db:
            db.execute(
                "UPDATE sessions SET input_tokens = input_tokens + ?, output_tokens = output_tokens + ?"
                " WHERE id = ?",
                (input_tokens, output_tokens, session_id),
            )

    def record_event(self, session_id: str, kind: str, detail: str) -> None:
        """Note something that happened to a session (a provider switch, a compression)."""
        with self._transaction() as db:
            db.execute(
                "INSERT INTO session_events (session_id, created_at, kind, detail) VALUES (?, ?, ?, ?)",
                (session_id, time.time(), kind, mask_secrets(detail)),
            )

    def record_model_call(self, session_id: str, model: str, usage: dict[str, int]) -> None:
        """Note the tokens of one model call of a session (usage as `Usage.as_dict()` gives it)."""
        with self._transaction() as db:
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
        """The session's model calls, oldest first: seq, model, created_at and the token counts."""
        rows = self._query(
            f"SELECT seq, model, created_at, {', '.join(_CALL_TOKENS)} FROM model_calls"
            " WHERE session_id = ? ORDER BY id",
            (session_id,),
        )
        return [dict(r) for r in rows]

    def events(self, session_id: str) -> list[dict[str, Any]]:
        rows = self._query(
            "SELECT kind, detail, created_at FROM session_events WHERE session_id = ? ORDER BY id",
            (session_id,),
        )
        return [dict(r) for r in rows]

    def add_fact(self, text: str, *, owner: str | None = None) -> int:
        """Store a fact; `owner` keeps it to one agent (None: the home's own facts)."""
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO facts (text, created_at, owner) VALUES (?, ?, ?)",
                (mask_secrets(text), time.time(), owner),
            )
            return int(cursor.lastrowid or 0)

    def relevant_facts(self, text: str, limit: int = 5, *, owner: str | None = None) -> list[str]:
        """Facts of `owner` sharing words with `text`, most relevant first (bm25)."""
        words = [w for w in re.findall(r"\w+", text.lower()) if len(w) > 2][:40]
        if not words:
            return []
        query = " OR ".join(f'"{w}"' for w in words)
        rows = self._query(
            "SELECT f.text FROM facts_fts JOIN facts f ON f.id = facts_fts.rowid"
            " WHERE facts_fts MATCH ? AND f.owner IS ? ORDER BY bm25(facts_fts) LIMIT ?",
            (query, owner, limit),
        )
        return [str(r["text"]) for r in rows]

    def get_todos(self, session_id: str) -> list[dict[str, Any]]:
        rows = self._query(
            "SELECT text, status FROM todos WHERE session_id = ? ORDER BY position", (session_id,)
        )
        return [{"id": i + 1, "text": r["text"], "status": r["status"]} for i, r in enumerate(rows)]

    def save_todos(self, session_id: str, items: list[dict[str, Any]]) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM todos WHERE session_id = ?", (session_id,))
            db.executemany(
                "INSERT INTO todos (session_id, position, text, status) VALUES (?, ?, ?, ?)",
                [(session_id, i, mask_secrets(t["text"]), t["status"]) for i, t in enumerate(items)],
            )

    def descendants(self, session_id: str) -> list[str]:
        rows = self._query(
            "WITH RECURSIVE tree(id) AS (SELECT ? UNION"
            " SELECT s.id FROM sessions s JOIN tree ON s.parent_id = tree.id) SELECT id FROM tree",
            (session_id,),
        )
        return [str(r["id"]) for r in rows]

    def delete_session(self, session_id: str) -> list[str]:
        """Delete a session with its descendants; returns the ids deleted."""
        ids = self.descendants(session_id)
        with self._transaction() as db:
            for sid in reversed(ids):
                db.execute("DELETE FROM messages WHERE session_id = ?", (sid,))
                db.execute("DELETE FROM session_events WHERE session_id = ?", (sid,))
                db.execute("DELETE FROM todos WHERE session_id = ?", (sid,))
                db.execute("DELETE FROM model_calls WHERE session_id = ?", (sid,))
                db.execute("DELETE FROM sessions WHERE id = ?", (sid,))
        return ids

    # -- messages ---------------------------------------------------------------------------------

    def append_message(
        self, session_id: str, message: Message, *, create: dict[str, Any] | None = None
    ) -> None:
        """Insert one final message and bump the session's counters, in one transaction.

        With `create` (the session's metadata), the session row is created in that same transaction, so
        a session never exists without the message that started it.
        """
        now = time.time()
        with self._transaction() as db:
            if create is not None:
                _insert_session(db, session_id, create)
            row = db.execute("SELECT message_count FROM sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise StoreError(f"no session {session_id!r}")
            db.execute(_INSERT_MESSAGE, _message_values(session_id, row[0], message, now))
            db.execute(
                "UPDATE sessions SET message_count = message_count + 1, updated_at = ?,"
                + _GOES_ON
                + " WHERE id = ?",
                (now, session_id),
            )

    def replace_messages(
        self, session_id: str, messages: list[Message], *, create: dict[str, Any] | None = None
    ) -> None:
        """Rewrite a session's messages (only for a repaired or adopted history); `create` as above."""
        now = time.time()
        with self._transaction() as db:
            if create is not None:
                _insert_session(db, session_id, create)
            db.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            db.executemany(
                _INSERT_MESSAGE, [_message_values(session_id, i, m, now) for i, m in enumerate(messages)]
            )
            db.execute(
                "UPDATE sessions SET message_count = ?, updated_at = ?," + _GOES_ON + " WHERE id = ?",
                (len(messages), now, session_id),
            )

    def load_messages(self, session_id: str) -> list[Message]:
        rows = self._query("SELECT * FROM messages WHERE session_id = ? ORDER BY seq", (session_id,))
        return [_row_to_message(r) for r in rows]

    def search(
        self,
        query: str,
        *,
        role: str | None = None,
        since: float | None = None,
        session_ids: list[str] | None = None,
        limit: int = 20,
        marks: tuple[str, str] = ("[", "]"),
    ) -> list[dict[str, Any]]:
        """Messages matching `query`, best first (bm25), each with a snippet and its session.

        `marks` open and close each matched word in the snippet (a page that must tell them from the
        stored text's own brackets passes markers the text cannot contain).
        """
        match = fts_query(query)
        if not match:
            return []
        sql = (
            "SELECT m.session_id, m.seq, m.role, m.created_at, s.title, s.source,"
            " snippet(messages_fts, 0, ?, ?, '…', 12) AS snippet, bm25(messages_fts) AS rank"
            " FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid"
            " JOIN sessions s ON s.id = m.session_id WHERE messages_fts MATCH ?"
        )
        params: list[Any] = [*marks, match]
        if role:
            sql += " AND m.role = ?"
            params.append(role)
        if since is not None:
            sql += " AND m.created_at >= ?"
            params.append(since)
        if session_ids:
            sql += f" AND m.session_id IN ({', '.join('?' * len(session_ids))})"
            params.extend(session_ids)
        sql += " ORDER BY rank LIMIT ?"
        params.append(limit)
        return [dict(r) for r in self._query(sql, tuple(params))]


# A session that ended (a one-shot's) and is written to again (resumed) has not ended; a compressed one
# stays ended: it went on in its child
_GOES_ON = (
    " ended_at = CASE WHEN end_reason = 'compressed' THEN ended_at END,"
    " end_reason = CASE WHEN end_reason = 'compressed' THEN end_reason END"
)


class SessionSink:
    """Persists one session's history changes; creates the session row with the first message."""

    def __init__(self, store: SessionStore, session_id: str, meta: Callable[[], dict[str, Any]]) -> None:
        self.store = store
        self.session_id = session_id
        self._meta = meta
        self._created = store.get_session(session_id) is not None

    def _creation(self, first: Message | None) -> dict[str, Any] | None:
        """The new session's row, to create with its first write; None once it exists."""
        if self._created:
            return None
        meta = self._meta()
        if first is not None and first["role"] == "user" and isinstance(first["content"], str):
            meta.setdefault("title", title_from(first["content"]))
        return meta

    def append_message(self, message: Message) -> None:
        self.store.append_message(self.session_id, message, create=self._creation(message))
        self._created = True

    def replace_messages(self, messages: list[Message]) -> None:
        first = next((m for m in messages if m.get("role") == "user"), None)
        self.store.replace_messages(self.session_id, messages, create=self._creation(first))
        self._created = True


def title_from(text: str, width: int = 60) -> str:
    """A session title from its first user message: one line, shortened at a word boundary."""
    line = " ".join(mask_secrets(text).split())
    if len(line) <= width:
        return line
    cut = line[:width].rsplit(" ", 1)[0]
    return (cut if len(cut) > width // 2 else line[:width]) + "…"
