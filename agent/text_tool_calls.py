"""Tool calls a model wrote as text, read back into structured calls.

Local models of the Qwen/Hermes family write `<tool_call>{"name": ..., "arguments": ...}</tool_call>` in
their answer when the server's chat template does not turn it into structured calls (llama.cpp silently
drops `tools` for a model whose template has none). Also read: `<function=NAME>{...}</function>`, and a
reply that is nothing but one such JSON object (or a list of them), `parameters` for `arguments` too.

Only what names an offered tool with a JSON object of arguments becomes a call; anything else stays text.
Markup quoted in a fenced code block or an inline code span is an example, never a call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from mibyan.agent.messages import ToolCall

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)", re.DOTALL | re.MULTILINE)
_INLINE_CODE = re.compile(r"`[^`\n]+`")
_OPENING = re.compile(r"<tool_call>|<function=([A-Za-z0-9_.:-]+)>")
_CLOSING = {"tool_call": re.compile(r"\s*</tool_call>"), "function": re.compile(r"\s*</function>")}
_DECODER = json.JSONDecoder()


@dataclass
class TextToolCalls:
    """The calls found, in the OpenAI chat format, and the text left once their markup is taken out."""

    text: str | None
    calls: list[ToolCall] = field(default_factory=list)


def _quoted_spans(text: str) -> list[tuple[int, int]]:
    spans = [m.span() for m in _FENCE.finditer(text)]
    spans += [m.span() for m in _INLINE_CODE.finditer(text) if not _inside(m.start(), spans)]
    return spans


def _inside(position: int, spans: list[tuple[int, int]]) -> bool:
    return any(start <= position < end for start, end in spans)


def _call(name: Any, arguments: Any, tools: frozenset[str]) -> ToolCall | None:
    """The structured call, or None when it names no offered tool or its arguments are no object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(name, str) or name not in tools or not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _from_object(value: Any, tools: frozenset[str]) -> ToolCall | None:
    if not isinstance(value, dict) or not {"name"} <= value.keys() <= {"name", "arguments", "parameters"}:
        return None
    return _call(value["name"], value.get("arguments", value.get("parameters")), tools)


def _json_at(text: str, position: int) -> tuple[Any, int] | None:
    """The JSON value starting at `position` (after blanks) and where it ends; None if there is none."""
    start = position + len(text[position:]) - len(text[position:].lstrip())
    try:
        return _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        return None


def _bare_reply(text: str, tools: frozenset[str]) -> TextToolCalls | None:
    """A reply that is only a call object, or a list of them."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return None
    decoded = _json_at(stripped, 0)
    if decoded is None or decoded[1] != len(stripped):
        return None
    values = decoded[0] if isinstance(decoded[0], list) else [decoded[0]]
    calls = [_from_object(value, tools) for value in values]
    if not values or any(call is None for call in calls):
        return None
    return TextToolCalls(text=None, calls=[call for call in calls if call is not None])


def tool_calls_in_text(text: str | None, tools: frozenset[str]) -> TextToolCalls | None:
    """The tool calls written in `text`, or None when it holds none that may run.

    Args:
        text: the reply's text.
        tools: the names of the tools the request offered.
    """
    if not text or not tools:
        return None
    bare = _bare_reply(text, tools)
    if bare is not None:
        return bare
    quoted = _quoted_spans(text)
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for opening in _OPENING.finditer(text):
        if opening.start() < position or _inside(opening.start(), quoted):
            continue
        decoded = _json_at(text, opening.end())
        if decoded is None:
            continue  # not JSON: left as it was written
        value, end = decoded
        name = opening.group(1)
        call = _from_object(value, tools) if name is None else _call(name, value, tools)
        if call is None:
            continue
        closing = _CLOSING["tool_call" if name is None else "function"].match(text, end)
        calls.append(call)
        kept.append(text[position : opening.start()])
        position = closing.end() if closing else end
    if not calls:
        return None
    kept.append(text[position:])
    rest = "".join(kept).strip()
    return TextToolCalls(text=rest or None, calls=calls)
