"""What changed in a watched session since the page was drawn, as server-sent events.

A page names the last message it shows (seq and id); each poll reads the messages from that seq on (an
index lookup, no transaction held) and turns each new one into an event carrying its HTML, rendered by
the same templates as the page. A tool result goes to its call (`result`), other messages are appended
(`message`), a subagent session that grew while its delegate_task call runs is redrawn under it
(`subagent`), a history rewritten under the page (an undo, a repair) asks for a reload (`reload`), and a
session continued in a compaction child points there (`continued`) and ends the stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_state import SessionStore
from mibyan.web import transcript

#: Renders one macro of _items.html with its arguments.
Render = Callable[..., str]


@dataclass
class Watch:
    """One page's view of its session: the last message it shows and the subagents it has drawn."""

    session_id: str
    seq: int
    message_id: int
    subagents: dict[str, int] | None = None  # subagent session → its message count when last drawn
    over: bool = False

    @property
    def last_event_id(self) -> str:
        return f"{self.seq}:{self.message_id}"


def event(kind: str, data: dict[str, Any], *, event_id: str | None = None) -> str:
    """One server-sent event; its data is JSON with every non-ASCII character escaped."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, ensure_ascii=True)}\n\n"


def poll(store: SessionStore, render: Render, watch: Watch) -> list[str]:
    """The events for what was stored since `watch` was last brought up to date; updates `watch`."""
    rows = transcript.new_rows(store, watch.session_id, max(watch.seq, 0))
    if watch.seq >= 0:
        if not rows or (rows[0]["seq"], rows[0]["id"]) != (watch.seq, watch.message_id):
            watch.over = True
            return [event("reload", {})]
        rows = rows[1:]
    events = []
    for row in rows:
        watch.seq, watch.message_id = row["seq"], row["id"]
        kind, data = _fragment(store, render, watch.session_id, row)
        events.append(event(kind, data, event_id=watch.last_event_id))
    continued, subagents = transcript.children(store, watch.session_id)
    events.extend(_grown_subagents(store, render, watch, subagents))
    if not rows and continued and _ended_compressed(store, watch.session_id):
        watch.over = True
        events.append(event("continued", {"html": render("continued", continued[-1])}))
    return events


def _ended_compressed(store: SessionStore, session_id: str) -> bool:
    row = store.sessions.get(session_id) or {}
    return row.get("end_reason") == "compressed"


def _grown_subagents(
    store: SessionStore, render: Render, watch: Watch, subagents: list[dict[str, Any]]
) -> list[str]:
    """A `subagent` event for each subagent session that has new messages since it was drawn (the
    first poll only takes note: the page drew them)."""
    counts = {row["id"]: row["message_count"] for row in subagents}
    if watch.subagents is None:
        watch.subagents = counts
        return []
    events = []
    for row in subagents:
        if watch.subagents.get(row["id"]) != row["message_count"]:
            html = render("nested", transcript.nested(store, row, 0))
            events.append(event("subagent", {"session": row["id"], "html": html}))
    watch.subagents = counts
    return events


def _fragment(
    store: SessionStore, render: Render, session_id: str, row: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    if row["role"] == "tool" and row["tool_call_id"]:
        call = transcript.live_result(store, session_id, row)
        alone = transcript.build_items([row])[0]
        return "result", {
            "call": call.call_id,
            "html": render("slot", call, ""),
            "alone": render("item", alone, ""),
        }
    item = transcript.build_items([row])[0]
    return "message", {"html": render("item", item, "")}
