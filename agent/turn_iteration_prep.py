"""Turn steps 4-6: the budget and interrupt checks, preflight compression, ephemeral prompt layers."""

from __future__ import annotations

from mibyan.agent.protocol import AgentBase
from mibyan.agent.turn_state import BudgetExhausted, Interrupted, PreparedRequest, TurnState

_PRESSURE = 0.7


class IterationPrepMixin(AgentBase):
    """Prepares each iteration's request, or says why there will be none."""

    def _prepare_iteration(self, turn: TurnState) -> PreparedRequest | Interrupted | BudgetExhausted:
        if self._signal.is_set():
            return Interrupted()
        if not turn.budget.consume():
            return BudgetExhausted()
        self._compress_if_needed(turn, self.settings.compression.threshold, "preflight")
        for note in turn.history.repair():
            self.callbacks.emit("status_callback", "repaired", note)
        for note in self.tools.refresh():
            self.callbacks.emit("status_callback", "mcp", note)
        # One pass over the history per iteration: it sizes the context-pressure note and calibrates.
        turn.request_estimate = self._estimator.raw_estimate(
            turn.history.messages, turn.system_prompt, self.tools.schemas
        )
        return PreparedRequest(
            system_prompt=turn.system_prompt,
            history=turn.history.messages,
            tools=self.tools.schemas,
            notes=tuple(self._ephemeral_layers(turn)),
        )

    def _ephemeral_layers(self, turn: TurnState) -> list[str]:
        """Notes sent with this request only, never stored: budget warnings and context pressure."""
        layers = [*turn.message_layers, *self._budget_layers(turn)]
        share = turn.request_estimate * self._estimator.factor / self._window
        if share >= _PRESSURE:
            layers.append(
                f"[Context: about {share:.0%} of the model's context window is in use. Keep tool "
                "outputs small (read files in ranges, filter command output).]"
            )
        return layers

    def _budget_layers(self, turn: TurnState) -> list[str]:
        used = turn.budget.fraction_used
        if used >= 0.9:
            return [
                f"[Iteration budget: {turn.budget.remaining} of {turn.budget.limit} model calls left. "
                "Finish now: give your answer with what you have.]"
            ]
        if used >= 0.7:
            return [
                f"[Iteration budget: {turn.budget.remaining} of {turn.budget.limit} model calls left. "
                "Start wrapping up.]"
            ]
        return []
