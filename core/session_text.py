"""Stored sessions as text: the ages, message renderings and exports the CLI and the viewer share.

Stored text came from the model, its tools and whoever wrote to them: every line made here goes through
`visible` (JSONL through `visible_json`, which keeps the data whole), so no escape sequence in it reaches
a terminal or a download.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from mibyan.core.sanitize import visible, visible_json


def age(timestamp: float) -> str:
    """How long ago `timestamp` was, in the largest whole unit ("3h ago", "just now")."""
    seconds = max(0, time.time() - timestamp)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"


def render_message(message: Mapping[str, Any]) -> str:
    """One stored message as plain text: a `[role]` header line, then its text and tool calls."""
    role = message["role"]
    if role == "tool":
        header = f"[tool {message.get('name') or ''} {message.get('tool_call_id')}]"
        return f"{header}\n{message.get('content') or ''}"
    text = message.get("content") or ""
    calls = message.get("tool_calls") or []
    calls_text = "\n".join(f"→ {c['function']['name']}({c['function']['arguments']})" for c in calls)
    return f"[{role}]\n" + "\n".join(part for part in (text, calls_text) if part)


def export_lines(title: str, messages: Iterable[Mapping[str, Any]], kind: str) -> Iterator[str]:
    """A session as JSONL (`kind` "jsonl": one message a line) or Markdown, each line safe on a terminal."""
    if kind == "jsonl":
        for message in messages:
            yield visible_json(json.dumps(message, ensure_ascii=False)) + "\n"
        return
    yield visible(f"# {title}") + "\n\n"
    for message in messages:
        body = visible(render_message(message).split(chr(10), 1)[-1])
        yield f"## {message['role']}\n\n{body}\n\n"
