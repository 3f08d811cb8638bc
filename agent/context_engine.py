"""The ContextEngine seam: when to compress a conversation and how.

An engine is pure: it gets the messages and returns shorter ones (or None); the agent applies the
result, checks it against the message rules, and continues in a child session. The default engine is
agent.context_compressor.ContextCompressor; `compression.engine: package.module:Class` picks another.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from mibyan.agent.hooks import import_callable
from mibyan.agent.messages import Message
from mibyan.agent.tokens import TokenEstimator
from mibyan.config.loader import AgentSettings
from mibyan.tools.schema import ToolSchema

Summarize = Callable[[str, str], str]


@dataclass(frozen=True)
class CompressionResult:
    """What a compression produced, and what it did, for the status line and the session record."""

    messages: list[Message]
    tokens_before: int
    tokens_after: int
    summarized: int
    pruned: int
    summary_failed: bool = False
    facts: list[str] = field(default_factory=list)  # to store before the summarized messages leave
    cut: int = 0  # messages whose text or arguments were cut to fit

    def describe(self) -> str:
        parts = [f"{self.tokens_before:,} → {self.tokens_after:,} tokens"]
        if self.summarized:
            parts.append(f"summarized {self.summarized} messages")
        if self.pruned:
            parts.append(f"pruned {self.pruned} old tool outputs")
        if self.cut:
            parts.append(f"cut {self.cut} oversized messages")
        if self.facts:
            parts.append(f"kept {len(self.facts)} facts in memory")
        if self.summary_failed:
            parts.append("the summarizer failed, so details were dropped")
        return "; ".join(parts)


class ContextEngine(ABC):
    """Decides when a history is too large and makes it smaller without breaking its rules.

    Args:
        settings: the agent's settings (`compression.*`).
        window: the model's context window in tokens.
        estimator: the agent's calibrated token estimator.
        summarize: `(system_prompt, prompt) -> text` through the auxiliary client; raises on failure.
    """

    def __init__(
        self, settings: AgentSettings, window: int, estimator: TokenEstimator, summarize: Summarize
    ) -> None:
        self.settings = settings
        self.window = window
        self.estimator = estimator
        self.summarize = summarize

    @abstractmethod
    def should_compress(
        self, messages: list[Message], *, system_prompt: str, tools: list[ToolSchema], threshold: float
    ) -> bool:
        """True when the next request would pass `threshold` of the window."""

    @abstractmethod
    def compress(
        self, messages: list[Message], *, system_prompt: str, tools: list[ToolSchema], reason: str
    ) -> CompressionResult | None:
        """A smaller history that obeys the message rules, or None when nothing can be done."""

    def on_session_start(self, session_id: str) -> None:  # noqa: B027 - an optional hook
        """Called when the agent starts (or resumes) a session."""

    def on_session_end(self, session_id: str) -> None:  # noqa: B027 - an optional hook
        """Called when compression ends a session and its child takes over."""


def load_engine(
    settings: AgentSettings, window: int, estimator: TokenEstimator, summarize: Summarize
) -> ContextEngine | None:
    """The configured engine, or None when compression is off."""
    if not settings.compression.enabled:
        return None
    if settings.compression.engine == "default":
        from mibyan.agent.context_compressor import ContextCompressor

        return ContextCompressor(settings, window, estimator, summarize)
    engine_class = import_callable(settings.compression.engine)
    engine = engine_class(settings, window, estimator, summarize)
    if not isinstance(engine, ContextEngine):
        from mibyan.core.errors import ConfigError

        raise ConfigError(f"compression.engine: {settings.compression.engine} is not a ContextEngine")
    return engine
