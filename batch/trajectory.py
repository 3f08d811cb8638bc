"""ShareGPT conversations from stored sessions, for training: `{from: system|human|gpt|tool, value}`.

Tool calls go into the `gpt` turn that made them as `<tool_call>` blocks, and each result is a `tool` turn
in the order the session stored it (the layout hermes-style function-calling data sets use).
"""

from __future__ import annotations

import json
from typing import Any

from agent_state import SessionStore


def _text(content: Any) -> str:
    """A message's text: its string, or the text of its content parts."""
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return str(content or "")


def _gpt_value(message: dict[str, Any]) -> str:
    pieces = [_text(message.get("content"))] if message.get("content") else []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = function.get("arguments")  # as the model sent it: the data shows what it did
        block = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
        pieces.append(f"<tool_call>\n{block}\n</tool_call>")
    return "\n".join(pieces)


def sharegpt(system_prompt: str | None, messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The turns of a session in ShareGPT form."""
    turns = [{"from": "system", "value": system_prompt}] if system_prompt else []
    names: dict[str, str] = {}
    for message in messages:
        role = message.get("role")
        if role == "user":
            turns.append({"from": "human", "value": _text(message.get("content"))})
        elif role == "assistant":
            for call in message.get("tool_calls") or []:
                names[str(call.get("id"))] = str((call.get("function") or {}).get("name"))
            turns.append({"from": "gpt", "value": _gpt_value(message)})
        elif role == "tool":
            call_id = str(message.get("tool_call_id"))
            result = {"name": names.get(call_id), "content": _text(message.get("content"))}
            block = json.dumps(result, ensure_ascii=False)
            turns.append({"from": "tool", "value": f"<tool_response>\n{block}\n</tool_response>"})
        elif role == "system":
            turns.append({"from": "system", "value": _text(message.get("content"))})
    return turns


def trajectory(store: SessionStore, session_id: str) -> list[dict[str, str]]:
    """The ShareGPT conversation of a stored session (its system prompt first)."""
    row = store.get_session(session_id) or {}
    messages = [dict(m) for m in store.load_messages(session_id)]
    return sharegpt(row.get("system_prompt"), messages)
