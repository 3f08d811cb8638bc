"""Replies that carry nothing usable: no visible text and no tool call."""

from __future__ import annotations

from agent.adapters.base import NormalizedResponse
from agent.callbacks import Callbacks
from agent.turn_state import TurnState


class RecoveryMixin:
    """Notices empty and reasoning-only replies."""

    callbacks: Callbacks

    def _check_empty_reply(self, turn: TurnState, reply: NormalizedResponse) -> NormalizedResponse:
        if not reply.tool_calls and not (reply.content or "").strip():
            what = "only reasoning" if reply.reasoning else "nothing"
            self.callbacks.emit("status_callback", "empty_reply", f"the model replied with {what}")
        return reply
