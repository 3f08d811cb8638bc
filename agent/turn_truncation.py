"""finish_reason "length": the reply was cut at the token limit.

Truncated text is kept and the user is told; truncated tool calls are never run, because their
arguments are cut JSON that could do something other than what the model meant.
"""

from __future__ import annotations

from agent.adapters.base import NormalizedResponse
from agent.callbacks import Callbacks
from agent.errors import ProviderError
from agent.turn_state import Failed, TurnState


class TruncationMixin:
    """Decides what a reply cut at the token limit may still be used for."""

    callbacks: Callbacks

    def _handle_truncation(self, turn: TurnState, reply: NormalizedResponse) -> NormalizedResponse | Failed:
        if reply.finish_reason != "length":
            return reply
        if reply.tool_calls:
            return Failed(
                ProviderError(
                    "the reply was cut at the token limit inside a tool call; raise agent.max_tokens",
                    reason="bad_request",
                )
            )
        self.callbacks.emit("status_callback", "truncated", "the answer was cut at the token limit")
        return reply
