"""Step 7 of the turn: prompt-caching markers for the API modes that take them.

Chat Completions and Responses cache prefixes on their own, so their requests go out unchanged.
Anthropic needs explicit `cache_control` breakpoints (at most 4). Two never move: the last tool and the
system prompt. One moves with the conversation: the last block of the newest user message (a user turn
or the newest tool results). The API also looks for cached prefixes at the block boundaries before a
breakpoint, so the prefix the previous request wrote is read back, and no earlier marker has to be
taken away: each request is the previous one, byte for byte, up to its breakpoint, plus what is new.
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
