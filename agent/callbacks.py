"""The callbacks through which the CLI, a gateway or a Python caller watch the agent work.

Each is optional. A callback that raises is logged and the turn goes on: a display bug must never
cost the user their turn. Streaming callbacks run on the call's worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from mibyan.agent.interruptible import InterruptSignal

log = logging.getLogger("mibyan.callbacks")

Callback = Callable[..., Any]


@dataclass
class Callbacks:
    """The callback surfaces of the seeds, plus `approval_callback`.

    Attributes:
        tool_progress_callback: `(phase, name, detail)` before ("start") and after ("end") each tool call;
            detail has `arguments`, and at the end `ok`, `duration` and a `preview` of the result.
        thinking_callback: `(active)` when the model starts (True) and stops (False) thinking.
        reasoning_callback: `(text)` with each piece of reasoning the model shows.
        clarify_callback: `(question, choices) -> answer` when the model asks the user something.
        step_callback: `(info)` after each complete iteration (api_calls, tool names, finish reason).
        stream_delta_callback: `(text)` with each streamed piece of the answer, in order.
        tool_gen_callback: `(name)` as soon as a tool call's name is parsed from the stream.
        status_callback: `(kind, message)` on state changes: repairs, retries, failovers, interrupts.
        approval_callback: `(command, reason) -> "once" | "session" | "always" | "deny"`.
    """

    tool_progress_callback: Callback | None = None
    thinking_callback: Callback | None = None
    reasoning_callback: Callback | None = None
    clarify_callback: Callback | None = None
    step_callback: Callback | None = None
    stream_delta_callback: Callback | None = None
    tool_gen_callback: Callback | None = None
    status_callback: Callback | None = None
    approval_callback: Callback | None = None

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> Callbacks:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown AIAgent argument(s): {', '.join(unknown)}")
        return cls(**kwargs)

    def emit(self, name: str, *args: Any) -> Any:
        """Call the named callback if it is set; log (never raise) what it raises."""
        callback: Callback | None = getattr(self, name)
        if callback is None:
            return None
        try:
            return callback(*args)
        except Exception:  # a caller's callback must not break the turn
            log.exception("%s raised; the turn goes on", name)
            return None


class StreamRelay:
    """Passes stream events to the callbacks until the call is abandoned."""

    def __init__(self, callbacks: Callbacks, signal: InterruptSignal) -> None:
        self._callbacks = callbacks
        self._signal = signal
        self._thinking = False

    def start(self) -> None:
        self._thinking = True
        self._callbacks.emit("thinking_callback", True)

    def stop(self) -> None:
        if self._thinking:
            self._thinking = False
            self._callbacks.emit("thinking_callback", False)

    def on_text(self, delta: str) -> None:
        if not self._signal.is_set():
            self.stop()
            self._callbacks.emit("stream_delta_callback", delta)

    def on_reasoning(self, delta: str) -> None:
        if not self._signal.is_set():
            self._callbacks.emit("reasoning_callback", delta)

    def on_tool_call(self, name: str) -> None:
        if not self._signal.is_set():
            self.stop()
            self._callbacks.emit("tool_gen_callback", name)
