"""Context overflow: a request too large for the model is compressed and retried once, never resent as is."""

from __future__ import annotations

from agent.callbacks import Callbacks
from agent.context_engine import ContextEngine
from agent.errors import ProviderError
from agent.turn_state import TurnState


class OverflowMixin:
    """Recovers from a context-overflow error through the context engine, once per turn."""

    callbacks: Callbacks
    _context_engine: ContextEngine | None

    def _recover_from_overflow(self, turn: TurnState, error: ProviderError) -> bool:
        """Compress the history so the retry fits; False when that is not possible (the turn fails)."""
        if self._context_engine is None or turn.overflow_retried:
            return False
        turn.overflow_retried = True
        changed = self._context_engine.compress(turn.history, reason="overflow")
        if changed:
            self.callbacks.emit(
                "status_callback", "compressed", f"context overflow ({error}); compressed, retrying"
            )
        return changed
