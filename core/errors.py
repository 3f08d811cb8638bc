"""The exceptions of mibyan: one base class, failures and control signals apart.

Failures (`ConfigError`, `ProviderError`, `ToolError`) mean something went wrong and carry what a
user or the model needs to act on it. Control signals (`TurnInterrupted`) end a turn early on purpose.
"""

from __future__ import annotations

from typing import Literal

ProviderErrorReason = Literal[
    "rate_limit",
    "overloaded",
    "server",
    "timeout",
    "connection",
    "dropped_stream",
    "auth",
    "context_overflow",
    "bad_request",
    "content_filter",
    "malformed_reply",
    "incomplete_response",
    "unknown",
]

#: Reasons worth retrying the same call for: the next attempt may well succeed.
RETRYABLE_REASONS: frozenset[str] = frozenset(
    {"rate_limit", "overloaded", "server", "timeout", "connection", "dropped_stream", "malformed_reply"}
)


class MibyanError(Exception):
    """Base class of every exception mibyan raises on purpose."""


class ConfigError(MibyanError):
    """A configuration problem: a broken file, an unknown key, a bad value, a missing key.

    The message is one line that names the file and the key, ready to show the user.
    """


class ProviderError(MibyanError):
    """A model call failed, with the failure classified so the loop can decide what to do."""

    def __init__(
        self,
        message: str,
        *,
        reason: ProviderErrorReason = "unknown",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.reason: ProviderErrorReason = reason
        self.status = status
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.reason in RETRYABLE_REASONS


class ToolError(MibyanError):
    """A tool could not do what it was asked; the message goes back to the model as text."""


class ToolFailed(ToolError):
    """A tool ran but what it ran did not finish: its message is the whole result, given to the model
    as it is (no "error:" before it) and counted and shown as a failed call."""


class TurnInterrupted(MibyanError):
    """Control signal: the user (or a caller on another thread) interrupted the running turn."""


class AgentBusyError(MibyanError):
    """`run_conversation` was called on an agent that is already running one, or is closed.

    One agent holds one conversation; run conversations at once with one agent each.
    """
