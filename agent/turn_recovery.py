"""Replies that carry nothing usable: no visible text and no tool call.

An empty or reasoning-only reply is not an answer. The model is asked again (the iteration budget
counts each try); after three such replies in a row the attempt ends with reason `incomplete_response`,
so the loop can fail over instead of looping on a stalled model.
"""

from __future__ import annotations

from mibyan.agent.adapters.base import NormalizedResponse
from mibyan.agent.protocol import AgentBase
from mibyan.agent.turn_state import Continue, Failed, TurnState
from mibyan.core.errors import ProviderError

MAX_EMPTY_REPLIES = 3


class RecoveryMixin(AgentBase):
    """Notices empty and reasoning-only replies and decides whether to ask again."""

    def _check_empty_reply(
        self, turn: TurnState, reply: NormalizedResponse
    ) -> NormalizedResponse | Continue | Failed:
        if reply.tool_calls or (reply.content or "").strip():
            turn.empty_replies = 0
            return reply
        turn.empty_replies += 1
        what = "only reasoning" if reply.reasoning else "nothing"
        if turn.empty_replies >= MAX_EMPTY_REPLIES:
            return Failed(
                ProviderError(
                    f"the model replied with {what} {turn.empty_replies} times in a row",
                    reason="incomplete_response",
                )
            )
        self.callbacks.emit(
            "status_callback",
            "empty_reply",
            f"the model replied with {what}; asking again ({turn.empty_replies}/{MAX_EMPTY_REPLIES})",
        )
        return Continue()
