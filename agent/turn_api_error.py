"""Classify what went wrong with a model call, and retry what is worth retrying.

Classification reads SDK exceptions by their class names and status codes, so neither SDK has to be
imported to recognise the other's errors; transport errors that are not SDK errors count too.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from typing import Any
from urllib.parse import urlparse

from mibyan.agent.adapters.base import NormalizedResponse
from mibyan.agent.callbacks import ShownText
from mibyan.agent.messages import Message
from mibyan.agent.protocol import AgentBase
from mibyan.agent.providers import ProviderRuntime, read_api_key, resolve_runtime
from mibyan.agent.turn_state import Failed, Interrupted, PreparedRequest, TurnState
from mibyan.config.loader import load_settings
from mibyan.core.errors import (
    RETRYABLE_REASONS,
    ConfigError,
    MibyanError,
    ProviderError,
    ProviderErrorReason,
    TurnInterrupted,
)

log = logging.getLogger("mibyan.api")

_OVERFLOW_HINTS = (
    "context length",
    "context_length",
    "maximum context",
    "too many tokens",
    "prompt is too long",
    "context window",
    "input is too long",
    # llama.cpp: "Context size has been exceeded." (a 500, when its shared context is full) and "request
    # (N tokens) exceeds the available context size". Ollama's wordings say "context length", above.
    "context size has been exceeded",
    "exceeds the context",
    "exceeds the available context",
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


#: Failures after which the next provider should take over (once retries, if any, are spent).
_FAILOVER_REASONS = (RETRYABLE_REASONS - {"malformed_reply"}) | {"auth", "incomplete_response"}


class ApiErrorMixin(AgentBase):
    """Wraps the model call in classification, retries with back-off, credential refresh and failover.

    Transient failures are retried on the same provider (`agent.api_max_retries`, back-off with jitter,
    a server's retry-after honoured up to `agent.max_retry_wait`). When the provider keeps failing, or
    asks to wait longer than that, the next provider of `fallback_providers` continues the conversation;
    a 401/403 first re-reads the key once. The primary is tried again at the next user turn, unless
    the agent shares its health record (`provider_health`) and the primary failed within
    `agent.health_check_interval`: then the turn starts on the first fallback that has not.
    """

    def _call_with_retries(
        self, turn: TurnState, request: PreparedRequest
    ) -> NormalizedResponse | Interrupted | Failed:
        """Call the model; retry, refresh or fail over; return the reply or the step that ends the turn."""
        turn.shown_text, turn.shown_reasoning = ShownText(), ShownText()  # a new reply: nothing shown yet
        while True:
            outcome = self._call_this_provider(turn, request)
            error = failover_cause(outcome)
            if error is not None and self._fail_over(error):
                continue
            return outcome

    def _call_without_tools(
        self, turn: TurnState, extra_messages: tuple[Message, ...], notes: tuple[str, ...]
    ) -> NormalizedResponse | Interrupted | Failed:
        """A call that describes the tools but may not use them (summaries, continuations).

        `extra_messages` follow the history in this request only; a retry (after a compression, too)
        sends them again.
        """
        request = PreparedRequest(
            system_prompt=turn.system_prompt,
            history=turn.history.messages,
            tools=self.tools.schemas,
            extra_messages=extra_messages,
            notes=notes,
            allow_tool_calls=False,
        )
        return self._call_with_retries(turn, request)

    def _call_this_provider(
        self, turn: TurnState, request: PreparedRequest
    ) -> NormalizedResponse | Interrupted | Failed:
        retries = self.settings.agent.api_max_retries
        attempt = 0
        refreshed = False
        while True:
            try:
                return self._call_model_once(turn, request)
            except TurnInterrupted:
                return Interrupted()
            except Exception as exc:  # the classification boundary: every failure gets a reason
                error = classify_error(exc)
            if error.reason == "context_overflow":
                unrecoverable = self._recover_from_overflow(turn, error)
                if unrecoverable is not None:
                    return Failed(unrecoverable)
                # The compressed history, with the same request-only messages and notes as before.
                request = dataclasses.replace(request, history=turn.history.messages)
                continue
            if error.reason == "auth" and not refreshed:
                refreshed = True
                if self._refresh_credentials():
                    continue
            wait_cap = self.settings.agent.max_retry_wait
            asks_too_long = error.retry_after is not None and error.retry_after > wait_cap
            if not error.retryable or attempt >= retries or (asks_too_long and self._has_fallback()):
                return Failed(located(error, self.provider.runtime))
            delay = backoff_delay(attempt, error.retry_after, wait_cap)
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

    def _refresh_credentials(self) -> bool:
        """Re-read the key (command, variable, config file); True when a different key was found."""
        try:
            settings = load_settings(home=self.home, cwd=self.workdir)
            config = settings.providers.get(self.provider.runtime.provider)
            key = read_api_key(config, os.environ) if config is not None else None
        except MibyanError as exc:
            self.callbacks.emit("status_callback", "auth", f"could not re-read the key: {exc}")
            return False
        if not key or key == self.provider.runtime.api_key:
            return False
        self.provider.runtime.api_key = key
        self.provider.drop_client()
        self.callbacks.emit(
            "status_callback", "auth", f"re-read the key of {self.provider.runtime.provider}; retrying"
        )
        return True

    def _has_fallback(self) -> bool:
        return self.provider.runtime.fallback_index < len(self.settings.fallback_providers)

    def _fail_over(self, error: ProviderError) -> bool:
        """Switch to the next healthy fallback provider; False when none is left."""
        runtime = self.provider.runtime
        self.provider.health.mark_failed(runtime.provider, runtime.model)
        fallback = self._healthy_fallback(runtime.fallback_index)
        if fallback is None:
            return False
        self._switch_runtime(fallback, f"{error.reason}: {error}")
        return True

    def _healthy_fallback(self, start: int) -> ProviderRuntime | None:
        """The first entry of `fallback_providers` from `start` on that has not failed lately."""
        interval = self.settings.agent.health_check_interval
        chain = self.settings.fallback_providers
        for index in range(start, len(chain)):
            entry = chain[index]
            model = entry.model or self.provider.primary.model
            if self.provider.health.failed_within(entry.provider, model, interval) is not None:
                continue
            try:
                return resolve_runtime(
                    self.settings,
                    provider=entry.provider,
                    model=model,
                    base_url=None,
                    api_key=None,
                    api_mode=None,
                    env=os.environ,
                    fallback_index=index + 1,
                )
            except ConfigError as exc:
                self.callbacks.emit(
                    "status_callback", "failover", f"skipping fallback {entry.provider}: {exc}"
                )
        return None

    def _switch_runtime(self, runtime: ProviderRuntime, why: str) -> None:
        old = self.provider.runtime
        self.provider.switch_to(runtime, self.settings)
        message = f"switched from {old.provider}/{old.model} to {runtime.provider}/{runtime.model} ({why})"
        self.callbacks.emit("status_callback", "failover", message)
        self.session.store.events.record(self.session.session_id, "provider_switch", message)

    def _restore_primary(self) -> None:
        """At a new user turn the primary provider gets another chance.

        With a shared health record (a gateway agent's runs), a primary that failed within
        `agent.health_check_interval` is skipped: the turn starts on the first fallback that has not.
        """
        skipped = self._primary_skipped()
        fallback = self._healthy_fallback(0) if skipped else None
        if skipped and fallback is not None:
            if self.provider.runtime.fallback_index != fallback.fallback_index:
                self._switch_runtime(fallback, skipped)
        elif self.provider.runtime is not self.provider.primary:
            self._switch_runtime(self.provider.primary, "new turn: trying the primary again")

    def _primary_skipped(self) -> str | None:
        """Why a turn should not start with the primary (it failed lately, for this or another agent)."""
        if not self.provider.shared_health:
            return None
        primary = self.provider.primary
        interval = self.settings.agent.health_check_interval
        ago = self.provider.health.failed_within(primary.provider, primary.model, interval)
        if ago is None:
            return None
        return f"{primary.provider}/{primary.model} failed {ago:.0f} s ago; skipped for {interval:g} s"


def located(error: ProviderError, runtime: ProviderRuntime) -> ProviderError:
    """The same error, its message naming the provider and the address it was sent to."""
    parsed = urlparse(runtime.base_url)
    host = parsed.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parsed.port is not None:
        netloc += f":{parsed.port}"
    address = parsed._replace(netloc=netloc, query="", fragment="").geturl()  # no user:password@, no ?key=
    return ProviderError(
        f"{error} ({runtime.provider} at {address})",
        reason=error.reason,
        status=error.status,
        retry_after=error.retry_after,
    )


def failover_cause(outcome: object) -> ProviderError | None:
    """The error to fail over on, when `outcome` is a failure the next provider might not have."""
    error = outcome.error if isinstance(outcome, Failed) else None
    return error if isinstance(error, ProviderError) and error.reason in _FAILOVER_REASONS else None
