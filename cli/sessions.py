"""`mibyan sessions`: list, show, search, export, rename and delete stored sessions; import a SQLite store.

Only the standard library and the store are imported here: no SDK, no pydantic or yaml (configuration
is not needed to read the store), so these answer at once. `--json` on list, show and search prints
machine-readable output with stable keys.

Stored text came from the model, its tools and whoever wrote to them: it is printed through `visible`
(JSON and JSONL through `visible_json`, which keeps the data whole), so no escape sequence in it
reaches a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from agent_state import SessionStore, store_url
from mibyan.config.paths import mibyan_home
from mibyan.core import session_text
from mibyan.core.errors import MibyanError
from mibyan.core.exit_codes import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from mibyan.core.sanitize import visible, visible_json
from mibyan.core.session_text import age

#: The fields of a session in `sessions list --json` and `sessions show --json`.
SESSION_KEYS = (
    "id",
    "parent_id",
    "title",
    "source",
    "channel",
    "model",
    "provider",
    "api_mode",
    "cwd",
    "created_at",
    "updated_at",
    "ended_at",
    "end_reason",
    "message_count",
    "input_tokens",
    "output_tokens",
)
#: The fields of a hit in `sessions search --json`.
HIT_KEYS = ("session_id", "seq", "role", "created_at", "title", "snippet")


class UsageError(MibyanError):
    """The command line asks for something that cannot be done (exit code 2)."""


def _print_json(value: object) -> None:
    sys.stdout.write(visible_json(json.dumps(value, ensure_ascii=False, indent=2)) + "\n")


def _session_json(row: dict[str, Any]) -> dict[str, Any]:
    return {key: row.get(key) for key in SESSION_KEYS}


def _list(store: SessionStore, args: argparse.Namespace) -> int:
    rows = store.sessions.newest_first(args.limit)
    if args.json:
        _print_json([_session_json(row) for row in rows])
        return EXIT_OK
    if not rows:
        print("no sessions yet: start one with 'mibyan chat'")
        return EXIT_OK
    print(f"{'ID':<12} {'AGE':<9} {'MSGS':>5}  {'MODEL':<22} TITLE")
    for row in rows:
        title = row["title"] or "(untitled)"
        if row["source"] == "subagent":
            title = f"↳ {title}"
        print(
            visible(
                f"{row['id']:<12} {age(row['updated_at']):<9} {row['message_count']:>5}  "
                f"{(row['model'] or '')[:22]:<22} {title}"
            )
        )
    return EXIT_OK


def _show(store: SessionStore, args: argparse.Namespace) -> int:
    session_id = store.sessions.resolve_id(args.id)
    row = store.sessions.get(session_id) or {}
    if args.json:
        _print_json({**_session_json(row), "messages": store.messages.load(session_id)})
        return EXIT_OK
    print(
        visible(
            f"session {session_id} · {row.get('title') or '(untitled)'} · {row.get('model')} · "
            f"{row.get('message_count')} messages"
        )
    )
    for message in store.messages.load(session_id):
        print()
        print(visible(session_text.render_message(message)))
    return EXIT_OK


def _search(store: SessionStore, args: argparse.Namespace) -> int:
    query = " ".join(args.query)
    if not store.search.words_query(query):
        raise UsageError(f"the search query {query!r} has no words to search for")
    since = None
    if args.since:
        from mibyan.tools.session_tools import parse_since  # the tool registry, only when needed

        since = parse_since(args.since)
    hits = store.search(query, role=args.role, since=since, limit=args.limit)
    if args.json:
        _print_json([{key: hit.get(key) for key in HIT_KEYS} for hit in hits])
        return EXIT_OK if hits else EXIT_ERROR
    if not hits:
        print("no matches")
        return EXIT_ERROR
    for hit in hits:
        when = datetime.fromtimestamp(hit["created_at"]).strftime("%Y-%m-%d %H:%M")
        print(visible(f"{hit['session_id']}  #{hit['seq']:<4} {hit['role']:<9} {when}  {hit['title'] or ''}"))
        print(visible(f"    {hit['snippet']}"))
    return EXIT_OK


def export_lines(store: SessionStore, session_id: str, kind: str) -> Iterator[str]:
    """A stored session as JSONL or Markdown (`core.session_text.export_lines`), each line terminal-safe."""
    row = store.sessions.get(session_id) or {}
    return session_text.export_lines(row.get("title") or session_id, store.messages.load(session_id), kind)


def _export(store: SessionStore, args: argparse.Namespace) -> int:
    session_id = store.sessions.resolve_id(args.id)
    sys.stdout.writelines(export_lines(store, session_id, args.format))
    return EXIT_OK


def _delete(store: SessionStore, args: argparse.Namespace) -> int:
    session_id = store.sessions.resolve_id(args.id)
    doomed = store.lineage.descendants(session_id)
    if not args.yes:
        if not sys.stdin.isatty():
            sys.stderr.write("mibyan: refusing to delete without --yes when not at a terminal\n")
            return EXIT_USAGE
        extra = f" and {len(doomed) - 1} descendant(s)" if len(doomed) > 1 else ""
        answer = input(visible(f"Delete session {session_id}{extra}? [y/N] ")).strip().lower()
        if answer not in ("y", "yes"):
            print("kept")
            return EXIT_OK
    deleted = store.sessions.delete(session_id)
    print(f"deleted {', '.join(deleted)}")
    return EXIT_OK


def _rename(store: SessionStore, args: argparse.Namespace) -> int:
    session_id = store.sessions.resolve_id(args.id)
    store.sessions.rename(session_id, " ".join(args.title))
    return EXIT_OK


def _import(store: SessionStore, args: argparse.Namespace) -> int:
    """Copy a home's SQLite store (`--from`: a home or its state.db) into the configured PostgreSQL one."""
    from mibyan.store.transfer import copy_store

    source = Path(args.source) if args.source else mibyan_home()
    if source.is_dir():
        source = source / "state.db"
    if not source.is_file():
        raise UsageError(f"there is no SQLite store at {source} to import")
    with SessionStore(source, read_only=True) as old:
        copied = copy_store(old.database, store.database)
    print(
        visible(
            f"imported {copied.sessions} session(s) ({copied.messages} messages, {copied.facts} facts) "
            f"from {source} into {store.path}; {copied.skipped} were there already"
        )
    )
    return EXIT_OK


_ACTIONS = {
    "list": _list,
    "show": _show,
    "search": _search,
    "export": _export,
    "delete": _delete,
    "rename": _rename,
    "import": _import,
}


def run_sessions(args: argparse.Namespace) -> int:
    try:
        home = mibyan_home()
        if args.action == "import" and store_url(home) is None:
            raise UsageError(
                "nothing to import into: set store.url (or MIBYAN_STORE_URL) to a postgresql:// URL first"
            )
        reading = args.action in ("list", "show", "search", "export")
        store = SessionStore.open_for_reading(home) if reading else SessionStore.open(home)
        return _ACTIONS[args.action](store, args)
    except UsageError as exc:
        sys.stderr.write(f"mibyan: error: {visible(str(exc))}\n")
        return EXIT_USAGE
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {visible(str(exc))}\n")
        return EXIT_USAGE


def run_skills(args: argparse.Namespace) -> int:
    """`mibyan skills list`."""
    from pathlib import Path

    from mibyan.tools.skills import discover_skills

    skills = discover_skills(mibyan_home(), Path.cwd())
    if not skills:
        print(
            f"no skills yet: add a folder with a SKILL.md to {mibyan_home() / 'skills'} or ./.mibyan/skills"
        )
        return EXIT_OK
    for skill in skills:
        triggers = f"  (triggers: {', '.join(skill.triggers)})" if skill.triggers else ""
        print(visible(f"{skill.name}: {skill.description}{triggers}"))
    return EXIT_OK
