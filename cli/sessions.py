"""`mibyan sessions`: list, show, search, export, rename and delete stored sessions.

Only the standard library and the store are imported here: no SDK, so these answer at once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from typing import Any

from agent_state import SessionStore
from mibyan.agent.errors import MibyanError
from mibyan.cli.main import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from mibyan.config.loader import mibyan_home


def age(timestamp: float) -> str:
    seconds = max(0, time.time() - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"


def _list(store: SessionStore, args: argparse.Namespace) -> int:
    rows = store.list_sessions(args.limit)
    if not rows:
        print("no sessions yet: start one with 'mibyan chat'")
        return EXIT_OK
    print(f"{'ID':<12} {'AGE':<9} {'MSGS':>5}  {'MODEL':<22} TITLE")
    for row in rows:
        title = row["title"] or "(untitled)"
        if row["source"] == "subagent":
            title = f"↳ {title}"
        print(
            f"{row['id']:<12} {age(row['updated_at']):<9} {row['message_count']:>5}  "
            f"{(row['model'] or '')[:22]:<22} {title}"
        )
    return EXIT_OK


def _render_message(message: dict[str, Any]) -> str:
    role = message["role"]
    if role == "tool":
        header = f"[tool {message.get('name') or ''} {message.get('tool_call_id')}]"
        return f"{header}\n{message.get('content') or ''}"
    text = message.get("content") or ""
    calls = message.get("tool_calls") or []
    calls_text = "\n".join(f"→ {c['function']['name']}({c['function']['arguments']})" for c in calls)
    return f"[{role}]\n" + "\n".join(part for part in (text, calls_text) if part)


def _show(store: SessionStore, args: argparse.Namespace) -> int:
    session_id = store.resolve_id(args.id)
    row = store.get_session(session_id) or {}
    print(
        f"session {session_id} · {row.get('title') or '(untitled)'} · {row.get('model')} · "
        f"{row.get('message_count')} messages"
    )
    for message in store.load_messages(session_id):
        print()
        print(_render_message(message))
    return EXIT_OK


def _search(store: SessionStore, args: argparse.Namespace) -> int:
    from mibyan.tools.session_tools import parse_since

    hits = store.search(" ".join(args.query), role=args.role, since=parse_since(args.since), limit=args.limit)
    if not hits:
        print("no matches")
        return EXIT_ERROR
    for hit in hits:
        when = datetime.fromtimestamp(hit["created_at"]).strftime("%Y-%m-%d %H:%M")
        print(f"{hit['session_id']}  #{hit['seq']:<4} {hit['role']:<9} {when}  {hit['title'] or ''}")
        print(f"    {hit['snippet']}")
    return EXIT_OK


def _export(store: SessionStore, args: argparse.Namespace) -> int:
    session_id = store.resolve_id(args.id)
    messages = store.load_messages(session_id)
    if args.format == "jsonl":
        for message in messages:
            sys.stdout.write(json.dumps(message, ensure_ascii=False) + "\n")
        return EXIT_OK
    row = store.get_session(session_id) or {}
    sys.stdout.write(f"# {row.get('title') or session_id}\n\n")
    for message in messages:
        sys.stdout.write(f"## {message['role']}\n\n{_render_message(message).split(chr(10), 1)[-1]}\n\n")
    return EXIT_OK


def _delete(store: SessionStore, args: argparse.Namespace) -> int:
    session_id = store.resolve_id(args.id)
    doomed = store.descendants(session_id)
    if not args.yes:
        if not sys.stdin.isatty():
            sys.stderr.write("mibyan: refusing to delete without --yes when not at a terminal\n")
            return EXIT_USAGE
        extra = f" and {len(doomed) - 1} descendant(s)" if len(doomed) > 1 else ""
        answer = input(f"Delete session {session_id}{extra}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("kept")
            return EXIT_OK
    deleted = store.delete_session(session_id)
    print(f"deleted {', '.join(deleted)}")
    return EXIT_OK


def _rename(store: SessionStore, args: argparse.Namespace) -> int:
    session_id = store.resolve_id(args.id)
    store.rename(session_id, " ".join(args.title))
    return EXIT_OK


_ACTIONS = {
    "list": _list,
    "show": _show,
    "search": _search,
    "export": _export,
    "delete": _delete,
    "rename": _rename,
}


def run_sessions(args: argparse.Namespace) -> int:
    try:
        store = SessionStore.open(mibyan_home())
        return _ACTIONS[args.action](store, args)
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {exc}\n")
        return EXIT_USAGE


def run_skills(args: argparse.Namespace) -> int:
    """`mibyan skills list`."""
    from pathlib import Path

    from mibyan.agent.skills import discover_skills

    skills = discover_skills(mibyan_home(), Path.cwd())
    if not skills:
        print(
            f"no skills yet: add a folder with a SKILL.md to {mibyan_home() / 'skills'} or ./.mibyan/skills"
        )
        return EXIT_OK
    for skill in skills:
        triggers = f"  (triggers: {', '.join(skill.triggers)})" if skill.triggers else ""
        print(f"{skill.name}: {skill.description}{triggers}")
    return EXIT_OK
