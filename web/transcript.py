"""A session as the viewer shows it: messages with their tool calls paired to results, approvals and
interrupts marked, the compaction lineage, and subagent sessions placed under the call that started them.

Only reads, through a read-only `SessionStore`. A page of a long session is one range of `seq`s; a tool
result whose call is on an earlier page is shown on its own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from agent_state import SessionStore
from mibyan.agent.messages import INTERRUPTED_RESULT, NO_REPLY

#: Messages per page of a transcript (the viewer's default).
PAGE_SIZE = 2000
#: Messages of a subagent's session shown under its call (the rest: open the session).
NESTED_MESSAGES = 200
#: How deep subagents of subagents are nested before they are only linked.
NESTED_DEPTH = 2

#: The start of a tool result that means the command did not run because nobody approved it.
_REFUSALS = ("denied by user", "refused:", "blocked:", "not run:", "blocked by a hook")
#: The line of a delegate_task report naming the subagent's session (tools/delegation.py writes it).
_REPORTED_SESSION = re.compile(r"^status: .* · session (\S+)$", re.MULTILINE)


@dataclass
class Result:
    """A tool result, with what the viewer marks about it."""

    message_id: int
    seq: int
    content: str
    mark: str | None  # "interrupted", "refused" or None
    created_at: float


@dataclass
class Call:
    """One tool call of an assistant message."""

    call_id: str
    name: str
    arguments: str
    result: Result | None = None
    approval: dict[str, Any] | None = None
    subagents: list[Nested] = field(default_factory=list)


@dataclass
class Item:
    """One message as shown (a tool result joins its call instead, when the call is on the page)."""

    message_id: int
    seq: int
    role: str
    content: str | None
    created_at: float
    reasoning: str | None = None
    name: str | None = None
    calls: list[Call] = field(default_factory=list)
    result: Result | None = None  # a tool result shown on its own
    interrupted: bool = False
    notes: list[dict[str, Any]] = field(default_factory=list)  # what happened just before (events)


@dataclass
class Nested:
    """A subagent's session under the call that started it."""

    session: dict[str, Any]
    items: list[Item]
    more: int  # messages not shown here


@dataclass
class Transcript:
    """One page of a session."""

    session: dict[str, Any]
    items: list[Item]
    page: int
    pages: int
    parent: dict[str, Any] | None  # the session this one continues (compression) or serves (subagent)
    continued_in: list[dict[str, Any]]  # the compression children
    compacted: bool  # this session starts with a compression summary
    events: list[dict[str, Any]]  # those after the page's last message
    other_subagents: list[Nested]

    @property
    def last(self) -> tuple[int, int]:
        """(seq, message id) of the newest message on this page; (-1, 0) when there is none."""
        if not self.items:
            return -1, 0
        last = max(self.items, key=lambda item: item.seq)
        seqs = [last.seq, *(c.result.seq for c in last.calls if c.result is not None)]
        ids = [last.message_id, *(c.result.message_id for c in last.calls if c.result is not None)]
        return max(seqs), max(ids)


def result_of(row: dict[str, Any]) -> Result:
    """A stored tool message as a result, marked when it says the call was interrupted or refused."""
    content = row["content"] or ""
    mark = None
    if content == INTERRUPTED_RESULT:
        mark = "interrupted"
    elif content.startswith(_REFUSALS):
        mark = "refused"
    return Result(row["id"], row["seq"], content, mark, row["created_at"])


def _calls_of(row: dict[str, Any]) -> list[Call]:
    calls = []
    for raw in json.loads(row["tool_calls"]) if row["tool_calls"] else []:
        function = raw.get("function") or {}
        calls.append(
            Call(
                call_id=str(raw.get("id") or ""),
                name=str(function.get("name") or "?"),
                arguments=str(function.get("arguments") or ""),
            )
        )
    return calls


def message_rows(store: SessionStore, session_id: str, start: int, stop: int) -> list[dict[str, Any]]:
    """The session's messages with a seq from `start` to `stop` (excluded), without provider data."""
    return store.messages.rows(session_id, start, stop)


def new_rows(store: SessionStore, session_id: str, after_seq: int) -> list[dict[str, Any]]:
    """The messages from `after_seq` on (that one included, to tell whether it is still the same)."""
    return store.messages.rows(session_id, after_seq)


def build_items(rows: list[dict[str, Any]]) -> list[Item]:
    """Messages as items, each tool result joined to its call when the call is among `rows`."""
    items: list[Item] = []
    pending: dict[str, Call] = {}
    for row in rows:
        role = row["role"]
        if role == "tool":
            call = pending.pop(row["tool_call_id"] or "", None)
            if call is not None:
                call.result = result_of(row)
                continue
        item = Item(
            message_id=row["id"],
            seq=row["seq"],
            role=role,
            content=row["content"],
            created_at=row["created_at"],
            reasoning=row["reasoning"],
            name=row["name"],
        )
        if role == "assistant":
            item.calls = _calls_of(row)
            pending.update((call.call_id, call) for call in item.calls)
            item.interrupted = row["content"] == NO_REPLY
        elif role == "tool":
            item.result = result_of(row)
        items.append(item)
    return items


def _approvals(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for event in events:
        if event["kind"] != "approval":
            continue
        try:
            detail = json.loads(event["detail"] or "")
        except ValueError:
            continue
        if isinstance(detail, dict) and isinstance(detail.get("call_id"), str):
            found[detail["call_id"]] = detail
    return found


def children(store: SessionStore, session_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(compression children, subagent sessions) of a session, oldest first."""
    children = store.lineage.children(session_id)
    return [c for c in children if c["compacted"]], [c for c in children if not c["compacted"]]


def _place_subagents(
    store: SessionStore, items: list[Item], subagents: list[dict[str, Any]], depth: int
) -> list[dict[str, Any]]:
    """Put each subagent session under its delegate_task call among `items`; return those no call
    claims (their call is on another page, or the report that named them was lost)."""
    by_id = {row["id"]: row for row in subagents}
    delegations = [(item, call) for item in items for call in item.calls if call.name == "delegate_task"]
    placed: set[str] = set()
    for _, call in delegations:  # the report names each subagent's session
        if call.result is None:
            continue
        for session_id in _REPORTED_SESSION.findall(call.result.content):
            if session_id in by_id and session_id not in placed:
                call.subagents.append(nested(store, by_id[session_id], depth))
                placed.add(session_id)
    for item, call in delegations:  # still running (no report yet): the call's time span
        until = call.result.created_at if call.result is not None else float("inf")
        for row in subagents:
            if row["id"] not in placed and item.created_at <= row["created_at"] <= until:
                call.subagents.append(nested(store, row, depth))
                placed.add(row["id"])
    return [row for row in subagents if row["id"] not in placed]


def nested(store: SessionStore, session: dict[str, Any], depth: int) -> Nested:
    """A subagent's session to show under a call: its first messages, and its own subagents."""
    if depth >= NESTED_DEPTH:
        return Nested(session, [], session["message_count"])
    items = build_items(message_rows(store, session["id"], 0, NESTED_MESSAGES))
    events = store.events.of(session["id"])
    _mark_approvals(items, _approvals(events))
    _, subagents = children(store, session["id"])
    _place_subagents(store, items, subagents, depth + 1)
    return Nested(session, items, max(0, session["message_count"] - NESTED_MESSAGES))


def _place_notes(items: list[Item], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Put each event (a provider switch, say) before the first message stored after it; return the
    events after the last one."""
    left = sorted(events, key=lambda event: event["created_at"])
    for item in items:
        while left and left[0]["created_at"] <= item.created_at:
            item.notes.append(left.pop(0))
    return left


def _mark_approvals(items: list[Item], approvals: dict[str, dict[str, Any]]) -> None:
    for item in items:
        for call in item.calls:
            call.approval = approvals.get(call.call_id)


def load_transcript(
    store: SessionStore, session: dict[str, Any], page: int | None, *, page_size: int = PAGE_SIZE
) -> Transcript:
    """One page of `session` (the last page when `page` is None)."""
    session_id = session["id"]
    pages = max(1, -(-int(session["message_count"]) // page_size))
    page = pages - 1 if page is None else min(max(0, page), pages - 1)
    items = build_items(message_rows(store, session_id, page * page_size, (page + 1) * page_size))
    events = store.events.of(session_id)
    _mark_approvals(items, _approvals(events))
    continued_in, subagents = children(store, session_id)
    unclaimed = _place_subagents(store, items, subagents, 0)
    last_page = page == pages - 1
    parent = store.sessions.get(session["parent_id"]) if session.get("parent_id") else None
    return Transcript(
        session=session,
        items=items,
        page=page,
        pages=pages,
        parent=parent,
        continued_in=continued_in,
        compacted=any(event["kind"] == "compressed" for event in events),
        events=_place_notes(items, [e for e in events if e["kind"] not in ("approval", "compressed")]),
        other_subagents=[nested(store, row, 0) for row in unclaimed] if last_page else [],
    )


def live_result(store: SessionStore, session_id: str, row: dict[str, Any]) -> Call:
    """A tool result that has just arrived, as its call's result (with the subagents a report names)."""
    call = Call(call_id=str(row["tool_call_id"] or ""), name=str(row["name"] or ""), arguments="")
    call.result = result_of(row)
    if call.name == "delegate_task":
        _, subagents = children(store, session_id)
        by_id = {sub["id"]: sub for sub in subagents}
        for reported in dict.fromkeys(_REPORTED_SESSION.findall(call.result.content)):
            if reported in by_id:
                call.subagents.append(nested(store, by_id[reported], 0))
    return call
