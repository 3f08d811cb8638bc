"""Classify what went wrong with a model call, and retry what is worth retrying.

Classification reads SDK exceptions by their class names and status codes, so neither SDK has to be
imported to recognise the other's errors; transport errors that are not SDK errors count too.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

from agent.adapters.base import NormalizedResponse
from agent.callbacks import Callbacks
from agent.errors import ProviderError, ProviderErrorReason, TurnInterrupted
from agent.interruptible import InterruptSignal
from agent.turn_state import Failed, Interrupted, PreparedRequest, TurnState
from config.loader import AgentSettings

log = logging.getLogger("mibyan.api")

_OVERFLOW_HINTS = (
    "context length",
    "context_length",
    "maximum context",
    "too many tokens",
    "prompt is too long",
    "context window",
    "input is too long",
)
_FILTER_HINTS = ("content_filter", "content policy", "content management policy")


def _error_text(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            code = inner.get("code") or inner.get("type")
            return f"{inner['message']}" + (f" ({code})" if code else "")
    return str(exc) or type(exc).__name__


def _retry_after(exc: BaseException) -> float | None:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for name in ("retry-after-ms", "retry-after"):
        value = headers.get(name)
        if value:
            try:
                seconds = float(value)
            except ValueError:
                continue
            return seconds / 1000 if name.endswith("-ms") else seconds
    return None


def _reason_for_status(status: int, text: str) -> ProviderErrorReason:
    lowered = text.lower()
    if any(hint in lowered for hint in _OVERFLOW_HINTS) or status == 413:
        return "context_overflow"
    if any(hint in lowered for hint in _FILTER_HINTS):
        return "content_filter"
    if status == 429:
        return "rate_limit"
    if status in (401, 403):
        return "auth"
    if status == 408:
        return "timeout"
    if status in (503, 529) or "overloaded" in lowered:
        return "overloaded"
    if status >= 500:
        return "server"
    return "bad_request"


def classify_error(exc: BaseException) -> ProviderError:
    """Turn any failure of a model call into a ProviderError with a reason."""
    if isinstance(exc, ProviderError):
        return exc
    names = {cls.__name__ for cls in type(exc).__mro__}
    text = _error_text(exc)
    status: Any = getattr(exc, "status_code", None)
    if isinstance(status, int):
        reason = _reason_for_status(status, text)
        return ProviderError(
            f"HTTP {status}: {text}", reason=reason, status=status, retry_after=_retry_after(exc)
        )
    if names & {"APITimeoutError", "TimeoutException", "ReadTimeout", "ConnectTimeout", "TimeoutError"}:
        return ProviderError(f"the model call timed out: {text}", reason="timeout")
    if names & {"RemoteProtocolError", "ReadError", "StreamError", "IncompleteRead"}:
        return ProviderError(f"the connection dropped mid-reply: {text}", reason="dropped_stream")
    if names & {"APIConnectionError", "ConnectError", "TransportError", "NetworkError", "ConnectionError"}:
        return ProviderError(f"cannot reach the provider: {text}", reason="connection")
    if names & {"JSONDecodeError", "APIResponseValidationError"}:
        return ProviderError(f"the provider's reply is malformed: {text}", reason="malformed_reply")
    log.error("unclassified model-call failure", exc_info=exc)
    return ProviderError(f"{type(exc).__name__}: {text}", reason="unknown")


def backoff_delay(attempt: int, retry_after: float | None, cap: float) -> float:
    """Exponential back-off with jitter; a server's retry-after wins, up to `cap`."""
    if retry_after is not None:
        return min(max(retry_after, 0.0), cap)
    return min(0.5 * 2.0**attempt + random.uniform(0, 0.25), cap)


class ApiErrorMixin:
    """Wraps the model call in classification and retries with back-off."""

    settings: AgentSettings
    callbacks: Callbacks
    _signal: InterruptSignal

    _call_model_once: Callable[[TurnState, PreparedRequest], NormalizedResponse]
    _recover_from_overflow: Callable[[TurnState, ProviderError], bool]

    def _call_with_retries(
        self, turn: TurnState, request: PreparedRequest
    ) -> NormalizedResponse | Interrupted | Failed:
        """Call the model; retry transient failures; return the reply or the step that ends the turn."""
        retries = self.settings.agent.api_max_retries
        attempt = 0
        while True:
            try:
                return self._call_model_once(turn, request)
            except TurnInterrupted:
                return Interrupted()
            except Exception as exc:  # the classification boundary: every failure gets a reason
                error = classify_error(exc)
            if error.reason == "context_overflow" and self._recover_from_overflow(turn, error):
                continue
            if not error.retryable or attempt >= retries:
                return Failed(error)
            delay = backoff_delay(attempt, error.retry_after, self.settings.agent.max_retry_wait)
            attempt += 1
            self.callbacks.emit(
                "status_callback",
                "retry",
                f"{error} ({error.reason}); retry {attempt}/{retries} in {delay:.1f} s",
            )
            try:
                self._signal.sleep(delay)
            except TurnInterrupted:
                return Interrupted()
