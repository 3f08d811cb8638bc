"""The session an agent writes to: the store, the session's id, its history and where that is persisted.

`SessionHandle` is the one place the agent's session changes: a compression continues in a child
session (`continue_in_child`), and a conversation passed in becomes the session's history (`adopt`). A turn
reads the history through the handle, so nothing has to keep copies in step.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_state import SessionSink, SessionStore
from mibyan.agent.messages import History, Message


def new_session_id() -> str:
    """A short id that is easy to type and unique enough for one person's sessions."""
    return secrets.token_hex(5)


@dataclass
class SessionHandle:
    """The agent's session.

    Attributes:
        store: the session database.
        session_id: the session written to now (a compression moves it to a child).
        history: the conversation, persisted through `sink` as it changes.
        sink: appends to (or rewrites) the stored messages of `session_id`.
        meta: the session row's fields (model, provider, system prompt, ...), read when a row is created.
        parent_id: the session this one was started from (a subagent's parent), if any.
    """

    store: SessionStore
    session_id: str
    history: History
    sink: SessionSink
    meta: Callable[[], dict[str, Any]]
    parent_id: str | None = None

    @classmethod
    def open(
        cls,
        store: SessionStore,
        session_id: str,
        messages: list[Message],
        meta: Callable[[], dict[str, Any]],
        *,
        stored: bool | None = None,
    ) -> SessionHandle:
        """The handle of `session_id`; `stored`: whether its row exists, when the caller has read it."""
        sink = SessionSink(store, session_id, meta, stored=stored)
        return cls(
            store=store, session_id=session_id, history=History(messages, sink=sink), sink=sink, meta=meta
        )

    def adopt(self, messages: list[Message]) -> None:
        """Make `messages` the session's history, stored as such."""
        self.history = History(messages, sink=self.sink)
        self.sink.replace_messages(messages)

    def continue_in_child(self, messages: list[Message]) -> str:
        """End this session ("compressed") and go on in a new child session holding `messages`.

        The child keeps the parent's title and todo list; its parent_id is the old session, so the old
        messages stay searchable and resuming the old session lands here. Returns the child's id.
        """
        parent, child = self.session_id, new_session_id()
        self.store.sessions.end(parent, "compressed")
        title = (self.store.sessions.get(parent) or {}).get("title")
        self.store.sessions.create(child, **{**self.meta(), "parent_id": parent, "title": title})
        self.store.todos.save(child, self.store.todos.get(parent))
        sink = SessionSink(self.store, child, self.meta)
        sink.replace_messages(messages)
        self.session_id = child
        self.sink = sink
        self.history = History(messages, sink=sink)
        return child
