"""Compression in the turn: preflight, on a context-overflow error, between turns, and on request.

A context-overflow error is not retried as is: the history is compressed (each time harder: less
protected, more cut) and the call retried, a few times at most; when nothing fits, the error says
plainly what the user can do. Every compression ends the session (end_reason "compressed") and
continues in a child session whose parent_id is the old one, so the parent's messages stay searchable
and resuming the parent lands in the child.
"""

from __future__ import annotations

from typing import Any

from mibyan.agent.messages import repair_history
from mibyan.agent.protocol import AgentBase
from mibyan.agent.turn_state import TurnState
from mibyan.core.errors import ProviderError

_OVERFLOW_RECOVERIES = 3
_NOTHING_FITS = (
    "The conversation does not fit the model's context window even after compression: start a new "
    "session (/new in the chat, or 'mibyan chat' without --resume), or, if the model has a bigger window "
    "than mibyan assumes, set model.context_window in config.yaml"
)


class OverflowMixin(AgentBase):
    """Applies the context engine's compressions and moves the conversation into a child session."""

    def compress(self) -> dict[str, Any]:
        """Compress the conversation now (the REPL's /compress). Returns what was done."""
        done = self._compress(None, reason="manual")
        return {
            "compressed": done is not None,
            "session_id": self.session.session_id,
            "report": done or "nothing to compress",
        }

    def compress_if_needed(self) -> bool:
        """Compress now if the session is past `compression.gateway_threshold`, as the end of a turn does
        (for a caller that set `compress_between_turns` off to deliver the answer first).

        Returns:
            Whether the session was compressed (it continues in a child session then).
        """
        before = self.session.session_id
        self._compress_if_needed(None, self.settings.compression.gateway_threshold, "between turns")
        return self.session.session_id != before

    def _compress_if_needed(self, turn: TurnState | None, threshold: float, reason: str) -> None:
        engine = self._context_engine
        if engine is not None and engine.should_compress(
            self.session.history.messages,
            system_prompt=self._session_system_prompt(),
            tools=self.tools.schemas,
            threshold=threshold,
        ):
            self._compress(turn, reason=reason)

    def _recover_from_overflow(self, turn: TurnState, error: ProviderError) -> ProviderError | None:
        """Compress so the retry fits: None to retry, else the error to end the turn with."""
        if self._context_engine is not None and turn.overflow_recoveries < _OVERFLOW_RECOVERIES:
            turn.overflow_recoveries += 1
            if self._compress(turn, reason="overflow") is not None:
                return None
        return ProviderError(f"{error}. {_NOTHING_FITS}", reason="context_overflow", status=error.status)

    def _compress(self, turn: TurnState | None, *, reason: str) -> str | None:
        engine = self._context_engine
        if engine is None:
            return None
        result = engine.compress(
            self.session.history.messages,
            system_prompt=self._session_system_prompt(),
            tools=self.tools.schemas,
            reason=reason,
        )
        if result is None:
            return None
        problems = repair_history(result.messages)[1]
        if problems:  # an engine's bug must never reach the history
            self.callbacks.emit("status_callback", "compression_failed", "; ".join(problems))
            return None
        for fact in result.facts:  # the memory flush: what must outlive the dropped messages
            self.session.store.facts.add(fact, owner=self.memory.fact_owner)
        if not self.prompt.custom:
            self.prompt.text = None  # rebuilt for the child: memory written meanwhile gets in
        engine.on_session_end(self.session.session_id)
        child = self.session.continue_in_child(result.messages)
        report = f"{result.describe()}; continuing in session {child} ({reason})"
        self.session.store.events.record(child, "compressed", report)
        engine.on_session_start(child)
        self.callbacks.emit("status_callback", "compressed", report)
        return report
