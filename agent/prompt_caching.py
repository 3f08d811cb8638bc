"""Step 7 of the turn: prompt-caching markers for the API modes that take them.

Chat Completions and Responses cache prefixes on their own, so their requests go out unchanged.
Anthropic cache_control breakpoints arrive with the anthropic_messages adapter.
"""

from __future__ import annotations

from typing import Any


def apply_prompt_caching(body: dict[str, Any], api_mode: str) -> dict[str, Any]:
    """Return the request body with the cache markers `api_mode` needs (none for OpenAI modes)."""
    return body
