"""Step 7 of the turn: prompt-caching markers for the API modes that take them.

Chat Completions and Responses cache prefixes on their own, so their requests go out unchanged.
Anthropic needs explicit `cache_control` breakpoints (at most 4). They go where they do not move as the
history grows: the last tool, the system prompt, and the last block of the two newest user messages.
The newest one is this turn's end; the one before was the previous turn's end, so the prefix the
previous request wrote to the cache is read back now.
"""

from __future__ import annotations

import copy
from typing import Any

_EPHEMERAL = {"type": "ephemeral"}
_HISTORY_BREAKPOINTS = 2


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
