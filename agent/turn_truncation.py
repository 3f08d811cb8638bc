"""finish_reason "length": the reply was cut at the token limit.

Cut text is continued: the model is asked to go on from where it stopped (the request carries the part
so far and a note, neither stored), and the parts are joined into one answer. Cut tool calls are never
run, because their arguments are cut JSON that could do something other than what the model meant; each
gets a result telling the model the call was cut and to retry with less.
"""

from __future__ import annotations

from mibyan.agent.adapters.base import NormalizedResponse
from mibyan.agent.messages import assistant_message, tool_message, user_message
from mibyan.agent.protocol import AgentBase
from mibyan.agent.turn_state import Continue, Failed, Interrupted, PreparedRequest, TurnState

MAX_CONTINUATIONS = 3
_CONTINUE_NOTE = (
    "[Your reply was cut at the length limit. Continue exactly where it stopped, without repeating.]"
)
_CUT_CALL = (
    "not run: this call was cut off at the reply length limit, so its arguments are incomplete. "
    "Make the call again with less content (for a large file, write it in several smaller steps)."
)


class TruncationMixin(AgentBase):
    """Continues cut text; refuses cut tool calls."""

    def _handle_truncation(
        self, turn: TurnState, reply: NormalizedResponse, request: PreparedRequest
    ) -> NormalizedResponse | Continue | Interrupted | Failed:
        if reply.finish_reason != "length":
            return reply
        if reply.tool_calls:
            self.callbacks.emit(
                "status_callback", "truncated", "a tool call was cut at the length limit; not run"
            )
            turn.history.append(reply.as_message())
            for call in reply.tool_calls:
                turn.history.append(tool_message(call["id"], _CUT_CALL, name=call["function"]["name"]))
            return Continue()
        parts = [reply.content or ""]
        for _ in range(MAX_CONTINUATIONS):
            self.callbacks.emit(
                "status_callback", "truncated", "the answer was cut at the length limit; continuing"
            )
            so_far = "".join(parts)
            extra = (*request.extra_messages, assistant_message(so_far), user_message(_CONTINUE_NOTE))
            more = self._call_without_tools(turn, extra, request.notes)
            if not isinstance(more, NormalizedResponse):
                return more
            parts.append(more.content or "")
            reply = more
            if more.finish_reason != "length":
                break
        return NormalizedResponse(
            content="".join(parts),
            reasoning=reply.reasoning,
            finish_reason="stop",
            usage=reply.usage,
            provider_data=None,
        )
