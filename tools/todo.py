"""todo: the model's task list for this session (an agent-level tool: it lives in the session store)."""

from __future__ import annotations

from typing import Any

from agent_state import SessionStore
from mibyan.core.errors import ToolError
from mibyan.tools.context import RunContext
from mibyan.tools.registry import tool

STATUSES = ("pending", "in_progress", "done", "cancelled")
_MARKS = {"pending": "[ ]", "in_progress": "[~]", "done": "[x]", "cancelled": "[-]"}


def render_todos(items: list[dict[str, Any]]) -> str:
    if not items:
        return "(the task list is empty)"
    return "\n".join(f"{item['id']}. {_MARKS[item['status']]} {item['text']}" for item in items)


def apply_todo(
    store: SessionStore,
    session_id: str,
    action: str = "list",
    new: list[str] | None = None,
    number: int | None = None,
    status: str | None = None,
) -> str:
    """Run one todo action against the session's list and return the list as the model sees it."""
    items = store.todos.get(session_id)
    if action == "add":
        texts = [t.strip() for t in new or [] if isinstance(t, str) and t.strip()]
        if not texts:
            raise ToolError("add needs items: a list of task descriptions")
        items.extend({"id": 0, "text": text, "status": "pending"} for text in texts)
    elif action == "update":
        if not isinstance(number, int) or not 1 <= number <= len(items):
            raise ToolError(f"update needs the id of a task (1 to {len(items)})")
        if status not in STATUSES:
            raise ToolError(f"status must be one of {', '.join(STATUSES)}")
        items[number - 1]["status"] = status
    elif action == "clear":
        items = [item for item in items if item["status"] not in ("done", "cancelled")]
    elif action != "list":
        raise ToolError("action must be add, update, list or clear")
    store.todos.save(session_id, items)
    return render_todos(store.todos.get(session_id))


@tool(toolset="core")
def todo(
    ctx: RunContext,
    action: str = "list",
    items: list[str] | None = None,
    id: int | None = None,
    status: str | None = None,
) -> str:
    """Keep a task list for the current work: plan multi-step tasks, then mark progress as you go.

    Args:
        action: "add" (new tasks from items), "update" (set the status of task id), "list", or "clear"
            (drop finished and cancelled tasks).
        items: the task descriptions to add.
        id: the number of the task to update.
        status: the new status: pending, in_progress, done or cancelled.
    """
    session = ctx.require_agent("todo").session
    return apply_todo(session.store, session.session_id, action, items, id, status)
