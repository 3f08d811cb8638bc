"""session_search: the model searches what was said in past sessions (an agent-level tool)."""

from __future__ import annotations

import time
from datetime import datetime

from agent_state import SessionStore
from mibyan.core.errors import ToolError
from mibyan.tools.context import RunContext
from mibyan.tools.registry import tool

_MAX_LIMIT = 25


def parse_since(value: str | None) -> float | None:
    """'7d', '12h', '30m' (ago) or an ISO date such as '2026-11-01' → a timestamp."""
    if not value:
        return None
    value = value.strip()
    units = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
    if value[:-1].isdigit() and value[-1] in units:
        return time.time() - int(value[:-1]) * units[value[-1]]
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise ToolError(f"since must look like 7d, 12h or 2026-11-01, not {value!r}") from None


def format_hits(hits: list[dict[str, object]]) -> str:
    if not hits:
        return "no matches"
    lines = []
    for hit in hits:
        when = datetime.fromtimestamp(float(hit["created_at"])).strftime("%Y-%m-%d %H:%M")  # type: ignore[arg-type]
        lines.append(f"[{hit['session_id']} #{hit['seq']} {hit['role']} {when}] {hit['snippet']}")
    return "\n".join(lines)


def search_sessions(
    store: SessionStore,
    *,
    query: str,
    role: str | None,
    since: str | None,
    scope: str,
    current_lineage: list[str],
    limit: int,
    within: list[str] | None = None,
) -> str:
    """Run a session search for the model and format compact results (`within`: only these sessions)."""
    if scope not in ("all", "current"):
        raise ToolError("scope must be 'all' or 'current'")
    sessions = current_lineage if scope == "current" else within
    if sessions is not None and not sessions:
        return format_hits([])  # an empty list would filter nothing
    hits = store.search(
        query,
        role=role or None,
        since=parse_since(since),
        session_ids=sessions,
        limit=max(1, min(limit, _MAX_LIMIT)),
    )
    return format_hits(hits)


@tool(toolset="core")
def session_search(
    ctx: RunContext,
    query: str,
    role: str | None = None,
    since: str | None = None,
    scope: str = "all",
    limit: int = 10,
) -> str:
    """Search the text of past conversations with this user (all sessions, or only the current one).

    Use it when the user refers to earlier work ("what did we decide about X", "the command you gave me
    last week"). Results are ranked by relevance, one line each: [session_id #message role date] snippet.

    Args:
        query: the words to look for; every word must appear.
        role: only messages of this role: user, assistant or tool.
        since: only messages newer than this: 7d, 12h, or a date such as 2026-11-01.
        scope: "all" sessions, or "current" for this session and the ones it continues.
        limit: how many results to return (at most 25).
    """
    agent = ctx.require_agent("session_search")
    store = agent.session.store
    lineage = store.lineage.ancestry(agent.session.session_id)
    # a gateway channel's run sees its own channel's sessions, never other people's or agents'
    scoped = agent.session_scope
    within = None if scoped is None else [*lineage, *store.channels.sessions(scoped)]
    return search_sessions(
        store,
        query=str(query),
        role=role,
        since=since,
        scope=str(scope),
        current_lineage=lineage,
        limit=int(limit),  # the model may send "10" where the schema says integer
        within=within,
    )
