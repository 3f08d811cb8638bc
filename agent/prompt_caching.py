"""Step 7 of the turn: prompt-caching markers for the API modes that take them.

Chat Completions and Responses cache prefixes on their own, so their requests go out unchanged.
Anthropic needs explicit `cache_control` breakpoints (at most 4). Two never move: the last tool and the
system prompt. One moves with the conversation: the last block of the newest user message (a user turn
or the newest tool results). The API also looks for cached prefixes at the block boundaries before a
breakpoint, so the prefix the previous request wrote is read back, and no earlier marker has to be
taken away: each request is the previous one, byte for byte, up to its breakpoint, plus what is new.

Ephemeral notes (matched skills and facts, budget and context-pressure warnings) change from call to
call, so they never go into the system prompt or before a breakpoint: they are appended at the very end
of the request, after the last marker, where every API mode's prefix cache has already matched.
"""

from __future__ import annotations

import copy
from typing import Any

_EPHEMERAL = {"type": "ephemeral"}
_HISTORY_BREAKPOINTS = 1


def apply_prompt_caching(body: dict[str, Any], api_mode: str) -> dict[str, Any]:
    """Return the request body with the cache markers `api_mode` needs (none for OpenAI modes)."""
    if api_mode != "anthropic_messages":
        return body
    body = dict(body)
    if body.get("tools"):
        tools = list(body["tools"])
        tools[-1] = {**tools[-1], "cache_control": _EPHEMERAL}
        body["tools"] = tools
    if body.get("system"):
        system = list(body["system"])
        system[-1] = {**system[-1], "cache_control": _EPHEMERAL}
        body["system"] = system
    messages = list(body.get("messages") or [])
    marked = 0
    for index in range(len(messages) - 1, -1, -1):
        if marked == _HISTORY_BREAKPOINTS:
            break
        message = messages[index]
        if message["role"] != "user" or not message["content"]:
            continue
        content = copy.copy(message["content"])
        content[-1] = {**content[-1], "cache_control": _EPHEMERAL}
        messages[index] = {**message, "content": content}
        marked += 1
    body["messages"] = messages
    return body


def append_ephemeral_notes(body: dict[str, Any], api_mode: str, notes: tuple[str, ...]) -> dict[str, Any]:
    """Return the body with `notes` at its end, after the last cache breakpoint (unchanged without notes).

    They join the last user turn when the request ends with one (so roles still alternate), and are a
    user turn of their own after tool results.
    """
    if not notes:
        return body
    text = "\n\n".join(notes)
    body = dict(body)
    if api_mode == "codex_responses":
        note = {"role": "user", "content": [{"type": "input_text", "text": text}]}
        body["input"] = [*body.get("input", []), note]
        return body
    messages = list(body.get("messages") or [])
    last = messages[-1] if messages else None
    if api_mode == "anthropic_messages":
        block = {"type": "text", "text": text}
        if last is not None and last["role"] == "user":
            messages[-1] = {**last, "content": [*last["content"], block]}
        else:
            messages.append({"role": "user", "content": [block]})
    elif last is not None and last["role"] == "user" and isinstance(last.get("content"), str):
        messages[-1] = {**last, "content": f"{last['content']}\n\n{text}"}
    else:
        messages.append({"role": "user", "content": text})
    body["messages"] = messages
    return body
