"""Turn steps 4-6: the budget and interrupt checks, preflight compression, ephemeral prompt layers."""

from __future__ import annotations

from agent.adapters.base import ToolSchema
from agent.budget import IterationBudget
from agent.callbacks import Callbacks
from agent.context_engine import ContextEngine
from agent.interruptible import InterruptSignal
from agent.turn_state import BudgetExhausted, Interrupted, PreparedRequest, TurnState


class IterationPrepMixin:
    """Prepares each iteration's request, or says why there will be none."""

    callbacks: Callbacks
    _signal: InterruptSignal
    _budget: IterationBudget
    _context_engine: ContextEngine | None
    _tool_schemas: list[ToolSchema]

    def _prepare_iteration(self, turn: TurnState) -> PreparedRequest | Interrupted | BudgetExhausted:
        if self._signal.is_set():
            return Interrupted()
        if not self._budget.consume():
            return BudgetExhausted()
        engine = self._context_engine
        if engine is not None and engine.should_compress(turn.history, system_prompt=turn.system_prompt):
            engine.compress(turn.history, reason="preflight")
        for note in turn.history.repair():
            self.callbacks.emit("status_callback", "repaired", note)
        layers = self._ephemeral_layers(turn)
        system_prompt = "\n\n".join([turn.system_prompt, *layers]) if layers else turn.system_prompt
        return PreparedRequest(
            system_prompt=system_prompt, messages=turn.history.messages, tools=self._tool_schemas
        )

    def _ephemeral_layers(self, turn: TurnState) -> list[str]:
        """Notes sent with this request only, never stored: the budget warnings at 70% and 90%."""
        used = self._budget.fraction_used
        if used >= 0.9:
            return [
                f"[Iteration budget: {self._budget.remaining} of {self._budget.limit} model calls left. "
                "Finish now: give your answer with what you have.]"
            ]
        if used >= 0.7:
            return [
                f"[Iteration budget: {self._budget.remaining} of {self._budget.limit} model calls left. "
                "Start wrapping up.]"
            ]
        return []
