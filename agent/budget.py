"""The iteration budget: how many model calls one run may make."""

from __future__ import annotations

import threading


class IterationBudget:
    """A thread-safe count of model calls against a limit.

    Each agent has its own; a subagent gets a fresh one capped by `delegation.max_iterations`, so the
    total across parent and children can exceed the parent's limit (as the seeds specify).
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("an iteration budget needs at least one iteration")
        self.limit = limit
        self._used = 0
        self._grace_granted = False
        self._lock = threading.Lock()

    def consume(self) -> bool:
        """Take one iteration; False when none is left."""
        with self._lock:
            if self._used >= self.limit:
                return False
            self._used += 1
            return True

    def grant_grace_call(self) -> None:
        """Allow exactly one more call, once (a fallback that takes over a stalled, spent budget)."""
        with self._lock:
            if not self._grace_granted:
                self._grace_granted = True
                self.limit += 1

    @property
    def used(self) -> int:
        return self._used

    @property
    def remaining(self) -> int:
        return self.limit - self._used

    @property
    def fraction_used(self) -> float:
        return self._used / self.limit
