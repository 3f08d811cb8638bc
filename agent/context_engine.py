"""The ContextEngine seam: when to compress a conversation and how."""

from __future__ import annotations

from abc import ABC, abstractmethod

from agent.messages import History


class ContextEngine(ABC):
    """Decides when a history is too large and makes it smaller without breaking its rules."""

    @abstractmethod
    def should_compress(self, history: History, *, system_prompt: str) -> bool:
        """True when the next request would pass the engine's threshold."""

    @abstractmethod
    def compress(self, history: History, *, reason: str) -> bool:
        """Shrink the history in place (through `History`); True when anything changed."""
