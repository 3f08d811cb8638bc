"""Messages: one INSERT per final message, with the session's counters in the same transaction."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from mibyan.core.redact import mask_secrets
from mibyan.store.database import Connection, Database, Row, StoreError, row_dict
from mibyan.store.notices import MESSAGES
from mibyan.store.sessions import insert_session

if TYPE_CHECKING:
    from mibyan.agent.messages import Message

_COLUMNS = (
    "session_id", "seq", "role", "content", "tool_calls", "tool_call_id", "name", "reasoning",
    "provider_data", "created_at",
)  # fmt: skip
_INSERT = f"INSERT INTO messages ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' for _ in _COLUMNS)})"
#: What a session's row says of its messages: every write of them, by any process, changes it (one more
#: message, or a new updated_at), so a history read when the row said this is the one stored while it does.
_VERSION = "SELECT message_count, updated_at FROM sessions WHERE id = ?"
#: The columns a viewer shows (provider data, which may be large, left out).
_SHOWN = "id, seq, role, content, tool_calls, tool_call_id, name, reasoning, created_at"
# A session that ended (a one-shot's) and is written to again (resumed) has not ended; a compressed one
# stays ended: it went on in its child
_GOES_ON = (
    " ended_at = CASE WHEN end_reason = 'compressed' THEN ended_at END,"
    " end_reason = CASE WHEN end_reason = 'compressed' THEN end_reason END"
)


def _masked(value: str | None) -> str | None:
    return mask_secrets(value) if value else value


def _row_to_message(row: Row) -> Message:
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


Version = tuple[Any, Any]


def _weight(typed: Message) -> int:
    """About the memory a kept message holds, in characters."""
    message: Mapping[str, Any] = typed
    size = sum(
        len(message.get(key) or "")
        for key in ("content", "reasoning")
        if not isinstance(message.get(key), list)
    )
    for call in message.get("tool_calls") or ():
        size += len(call.get("function", {}).get("arguments") or "")
    return size + 100


class _Histories:
    """The histories the stores of one database in this process read or wrote lately, each with its
    session's version (see _VERSION) at the time: a gateway opens a channel's session at each of its
    messages, and reading the whole history again each time was most of what storing cost. They hold at
    most `kept` characters in all; the sessions used least lately go first."""

    def __init__(self, kept: int = 32_000_000) -> None:
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, tuple[Version, list[Message], int]] = OrderedDict()
        self._size = 0
        self._kept = kept

    def get(self, session_id: str, version: Version) -> list[Message] | None:
        """The history kept at `version` (a list of the caller's own; the messages are shared)."""
        with self._lock:
            known = self._sessions.get(session_id)
            if known is None or known[0] != version:
                return None
            self._sessions.move_to_end(session_id)
            return list(known[1])

    def put(self, session_id: str, version: Version, messages: list[Message]) -> None:
        with self._lock:
            self._forget(session_id)
            weight = sum(_weight(m) for m in messages)
            self._sessions[session_id] = (version, messages, weight)
            self._size += weight
            self._make_room()

    def extend(self, session_id: str, before: Version, after: Version, message: Message) -> None:
        """`message` was stored after the history as it was at `before`, which made it `after`."""
        with self._lock:
            known = self._sessions.get(session_id)
            if known is None:
                return
            if known[0] != before:  # written meanwhile by what this process did not see
                self._forget(session_id)
                return
            known[1].append(message)
            weight = _weight(message)
            self._sessions[session_id] = (after, known[1], known[2] + weight)
            self._size += weight
            self._make_room()

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._forget(session_id)

    def _make_room(self) -> None:
        while self._size > self._kept and self._sessions:
            self._forget(next(iter(self._sessions)))

    def _forget(self, session_id: str) -> None:
        known = self._sessions.pop(session_id, None)
        if known is not None:
            self._size -= known[2]


#: by database (its dialect and name: the connections of one file share them), the latest few
_HISTORIES: OrderedDict[tuple[str, str], _Histories] = OrderedDict()
_HISTORIES_LOCK = threading.Lock()
_DATABASES_KEPT = 8


def _histories_of(db: Database) -> _Histories:
    key = (db.dialect.name, db.name)
    with _HISTORIES_LOCK:
        histories = _HISTORIES.get(key)
        if histories is None:
            histories = _HISTORIES[key] = _Histories()
            while len(_HISTORIES) > _DATABASES_KEPT:
                _HISTORIES.popitem(last=False)
        _HISTORIES.move_to_end(key)
        return histories


class Messages:
    """The `messages` table: a session's history in `seq` order, secrets masked as it is written."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._histories = _histories_of(db)

    def append(self, session_id: str, message: Message, *, create: dict[str, Any] | None = None) -> None:
        """Insert one final message and bump the session's counters, in one transaction.

        With `create` (the session's metadata), the session row is created in that same transaction, so
        a session never exists without the message that started it.
        """
        now = time.time()
        with self._db.transaction() as db:
            if create is not None:
                insert_session(db, session_id, create)
            row = db.execute(_VERSION, (session_id,)).fetchone()
            if row is None:
                raise StoreError(f"no session {session_id!r}")
            values = _message_values(session_id, row["message_count"], message, now)
            db.execute(_INSERT, values)
            self._bump(db, "message_count + 1", now, session_id)
            self._db.announce(db, MESSAGES, session_id)  # a viewer's live page shows it
            stored = _row_to_message(dict(zip(_COLUMNS, values, strict=True)))
            before = (row["message_count"], row["updated_at"])
            self._histories.extend(session_id, before, (row["message_count"] + 1, now), stored)

    def replace(
        self, session_id: str, messages: list[Message], *, create: dict[str, Any] | None = None
    ) -> None:
        """Rewrite a session's messages (only for a repaired or adopted history); `create` as above."""
        now = time.time()
        with self._db.transaction() as db:
            if create is not None:
                insert_session(db, session_id, create)
            db.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            db.executemany(_INSERT, [_message_values(session_id, i, m, now) for i, m in enumerate(messages)])
            self._bump(db, str(len(messages)), now, session_id)
            self._db.announce(db, MESSAGES, session_id)
            self._histories.forget(session_id)

    @staticmethod
    def _bump(db: Connection, count: str, now: float, session_id: str) -> None:
        # `count` is an SQL expression this module writes (a number or "message_count + 1"), never input
        db.execute(
            f"UPDATE sessions SET message_count = {count}, updated_at = ?," + _GOES_ON + " WHERE id = ?",
            (now, session_id),
        )

    def load(self, session_id: str, *, shared: bool = False) -> list[Message]:
        """The session's messages in order, in the dict form of DESIGN §3: copies the caller may change,
        or with `shared` the very messages this process keeps, for a caller that never changes a message
        in place (History, whose messages are never changed once made)."""
        found = self._db.query(_VERSION, (session_id,))
        version = (found[0]["message_count"], found[0]["updated_at"]) if found else None
        if version is not None:
            known = self._histories.get(session_id, version)
            if known is not None:
                return known if shared else [cast("Message", dict(m)) for m in known]
        # read after the version: a write between the two makes the version kept older than the rows,
        # so the next load reads them again (never the other way round)
        rows = self._db.query("SELECT * FROM messages WHERE session_id = ? ORDER BY seq", (session_id,))
        messages = [_row_to_message(r) for r in rows]
        if version is not None:
            self._histories.put(session_id, version, messages)
            if not shared:
                return [cast("Message", dict(m)) for m in messages]
        return messages

    def rows(self, session_id: str, start: int, stop: int | None = None) -> list[dict[str, Any]]:
        """The stored rows of the messages with a seq from `start` to `stop` (excluded; None: the last),
        without provider data: id, seq, role, content, tool_calls (JSON text), tool_call_id, name,
        reasoning, created_at."""
        if stop is None:
            rows = self._db.query(
                f"SELECT {_SHOWN} FROM messages WHERE session_id = ? AND seq >= ? ORDER BY seq",
                (session_id, start),
            )
        else:
            rows = self._db.query(
                f"SELECT {_SHOWN} FROM messages WHERE session_id = ? AND seq >= ? AND seq < ? ORDER BY seq",
                (session_id, start, stop),
            )
        return [row_dict(row) for row in rows]
