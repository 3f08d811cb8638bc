"""Token accounting without a tokenizer: the provider's usage is the truth, an estimate fills the gap.

Before a call the request is estimated at four characters a token plus a few tokens per message; after
each call the estimate is calibrated against the input tokens the provider reported for that request.
No tokenizer tables are downloaded, and the estimate of a long history costs one pass over its text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from mibyan.agent.messages import Message, tool_calls_of
from mibyan.core.by_identity import ByIdentity
from mibyan.tools.schema import ToolSchema

_CHARS_PER_TOKEN = 4.0
_MESSAGE_OVERHEAD = 4
DEFAULT_WINDOW = 128_000

#: Context windows of models people use, by name prefix (the longest matching prefix wins).
CONTEXT_WINDOWS: dict[str, int] = {
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude-3": 200_000,
    "claude-sonnet-4": 200_000,
    "claude-opus-4": 200_000,
    "claude-haiku-4": 200_000,
    "claude": 200_000,
    "gemini-1.5": 1_000_000,
    "gemini-2": 1_000_000,
    "deepseek": 128_000,
    "llama-3": 128_000,
    "qwen": 128_000,
    "mistral-large": 128_000,
}


def known_context_window(model: str) -> int | None:
    """The context window of `model` from the table (the longest matching name prefix), or None."""
    name = model.rsplit("/", 1)[-1].lower()
    matches = [prefix for prefix in CONTEXT_WINDOWS if name.startswith(prefix)]
    return CONTEXT_WINDOWS[max(matches, key=len)] if matches else None


def context_window_for(model: str, override: int | None = None, discovered: int | None = None) -> int:
    """The context window of `model`: the configured override, the table, what its server said, else 128k."""
    return override or known_context_window(model) or discovered or DEFAULT_WINDOW


def _message_chars(message: Message) -> int:
    content = message.get("content")
    size = len(content) if isinstance(content, str) else len(json.dumps(content)) if content else 0
    for call in tool_calls_of(message):
        size += len(call["function"].get("name", "")) + len(call["function"].get("arguments") or "")
    return size + len((message.get("reasoning") if message["role"] == "assistant" else None) or "")


#: each message sized once: a history is estimated several times a turn, its messages never change
_MESSAGE_CHARS: ByIdentity[Message, int] = ByIdentity(_message_chars, weigh=lambda chars: chars + 100)


class TokenEstimator:
    """Estimates request sizes and learns from the provider's reported usage."""

    def __init__(self) -> None:
        self.factor = 1.0

    def raw_estimate(
        self, messages: list[Message], system_prompt: str = "", tools: Sequence[ToolSchema] = ()
    ) -> float:
        chars = len(system_prompt) + sum(_MESSAGE_CHARS(m) for m in messages)
        chars += sum(t.chars for t in tools)
        return chars / _CHARS_PER_TOKEN + _MESSAGE_OVERHEAD * (len(messages) + 1)

    def estimate(
        self, messages: list[Message], system_prompt: str = "", tools: Sequence[ToolSchema] = ()
    ) -> int:
        return int(self.raw_estimate(messages, system_prompt, tools) * self.factor)

    def calibrate(self, raw_estimate: float, reported_input_tokens: int) -> None:
        """Move the factor toward what the provider reported (a moving average, bounded)."""
        if raw_estimate <= 0 or reported_input_tokens <= 0:
            return
        observed = min(max(reported_input_tokens / raw_estimate, 0.25), 4.0)
        self.factor = 0.5 * self.factor + 0.5 * observed
