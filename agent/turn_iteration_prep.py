"""Turn steps 4-6: the budget and interrupt checks, preflight compression, ephemeral prompt layers."""

from __future__ import annotations

from collections.abc import Callable

from mibyan.agent.adapters.base import ToolSchema
from mibyan.agent.budget import IterationBudget
from mibyan.agent.callbacks import Callbacks
from mibyan.agent.interruptible import InterruptSignal
from mibyan.agent.tokens import TokenEstimator
from mibyan.agent.turn_state import BudgetExhausted, Interrupted, PreparedRequest, TurnState
from mibyan.config.loader import AgentSettings

_PRESSURE = 0.7


class IterationPrepMixin:
    """Prepares each iteration's request, or says why there will be none."""

    callbacks: Callbacks
    _signal: InterruptSignal
    _budget: IterationBudget
    _tool_schemas: list[ToolSchema]
    _estimator: TokenEstimator
    _window: int
    settings: AgentSettings
    _compress_if_needed: Callable[[TurnState | None, float, str], None]

    def _prepare_iteration(self, turn: TurnState) -> PreparedRequest | Interrupted | BudgetExhausted:
        if self._signal.is_set():
            return Interrupted()
        if not self._budget.consume():
            return BudgetExhausted()
        self._compress_if_needed(turn, self.settings.compression.threshold, "preflight")
        for note in turn.history.repair():
            self.callbacks.emit("status_callback", "repaired", note)
        # One pass over the history per iteration: it sizes the context-pressure note and calibrates.
        turn.request_estimate = self._estimator.raw_estimate(
            turn.history.messages, turn.system_prompt, self._tool_schemas
        )
        return PreparedRequest(
            system_prompt=turn.system_prompt,
            history=turn.history.messages,
            tools=self._tool_schemas,
            notes=tuple(self._ephemeral_layers(turn)),
        )

    def _ephemeral_layers(self, turn: TurnState) -> list[str]:
        """Notes sent with this request only, never stored: budget warnings and context pressure."""
        layers = [*turn.message_layers, *self._budget_layers()]
        share = turn.request_estimate * self._estimator.factor / self._window
        if share >= _PRESSURE:
            layers.append(
                f"[Context: about {share:.0%} of the model's context window is in use. Keep tool "
                "outputs small (read files in ranges, filter command output).]"
            )
        return layers

    def _budget_layers(self) -> list[str]:
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
