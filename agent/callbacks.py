"""The callbacks through which the CLI, a gateway or a Python caller watch the agent work.

Each is optional. A callback that raises is logged and the turn goes on: a display bug must never
cost the user their turn. Streaming callbacks run on the call's worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from mibyan.core.interruptible import InterruptSignal

if TYPE_CHECKING:
    from mibyan.tools.approval import ApprovalCallback

log = logging.getLogger("mibyan.callbacks")

Callback = Callable[..., Any]
CallbackName = Literal[
    "tool_progress_callback",
    "thinking_callback",
    "reasoning_callback",
    "clarify_callback",
    "step_callback",
    "stream_delta_callback",
    "tool_gen_callback",
    "status_callback",
    "approval_callback",
]


@dataclass
class Callbacks:
    """The callback surfaces of the seeds, plus `approval_callback`.

    Attributes:
        tool_progress_callback: `(phase, name, detail)` before ("start") and after ("end") each tool call;
            detail has `arguments` and the model's `call_id`, at the start the call's `index` among the
            reply's calls, and at the end `ok`, `interrupted` (the call was stopped by an interrupt),
            `duration`, the `result` text and a `preview` of it.
        thinking_callback: `(active)` when the model starts (True) and stops (False) thinking.
        reasoning_callback: `(text)` with each piece of reasoning the model shows (without streaming, the
            whole reasoning of the reply at once).
        clarify_callback: `(question, choices) -> answer` when the model asks the user something.
        step_callback: `(info)` after each complete iteration (api_calls, tool names, finish reason).
        stream_delta_callback: `(text)` with each streamed piece of the answer, in order.
        tool_gen_callback: `(name)` as soon as a tool call's name is parsed from the stream.
        status_callback: `(kind, message)` on state changes: repairs, retries, failovers, interrupts.
        approval_callback: `(subject, reason) -> "once" | "session" | "always" | "deny"` (subject: the
            command line, or what a file or MCP call would do); or an `Approver`, whose function is
            handed the whole `ApprovalRequest` (call id, tool, subject, verdict) instead.
    """

    tool_progress_callback: Callback | None = None
    thinking_callback: Callback | None = None
    reasoning_callback: Callback | None = None
    clarify_callback: Callback | None = None
    step_callback: Callback | None = None
    stream_delta_callback: Callback | None = None
    tool_gen_callback: Callback | None = None
    status_callback: Callback | None = None
    approval_callback: ApprovalCallback | None = None

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> Callbacks:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown AIAgent argument(s): {', '.join(unknown)}")
        return cls(**kwargs)

    def emit(self, name: CallbackName, *args: Any) -> Any:
        """Call the named callback if it is set; log (never raise) what it raises."""
        callback: Callback | None = getattr(self, name)
        if callback is None:
            return None
        try:
            return callback(*args)
        except Exception:  # a caller's callback must not break the turn
            log.exception("%s raised; the turn goes on", name)
            return None


_RESTART = "the retried answer differs: it is shown again from the start"


class ShownText:
    """What the stream callbacks already showed of one reply, kept across the retries of its call.

    A retry after a dropped stream starts the reply again. While its text repeats what is shown, nothing
    is passed on; once it goes further, only the new part is. A retry that says something else cannot be
    taken back from the screen: `restart` tells the display to start over, then the new text is shown
    whole.
    """

    def __init__(self) -> None:
        self.text = ""

    def attempt(self) -> _Attempt:
        return _Attempt(self)


class _Attempt:
    """One attempt's view of the shown text: how far it has repeated it."""

    def __init__(self, shown: ShownText) -> None:
        self._shown = shown
        self._position = 0
        self._caught_up = False

    @property
    def shown(self) -> str:
        return self._shown.text

    def new_part(self, delta: str) -> tuple[str, bool]:
        """The part of `delta` not yet shown, and whether the display must start over first."""
        if self._caught_up:
            self._shown.text += delta
            return delta, False
        shown = self._shown.text
        overlap = shown[self._position : self._position + len(delta)]
        if delta.startswith(overlap):
            self._position += len(delta)
            if self._position < len(shown):
                return "", False  # all of it is on the screen already
            self._caught_up = True
            fresh = delta[len(overlap) :]
            self._shown.text += fresh
            return fresh, False
        self._caught_up = True
        self._shown.text = shown[: self._position] + delta
        return self._shown.text, True

    def settle(self) -> bool:
        """At the end of a successful attempt: True when the screen shows more than this reply said
        (it stopped short of what an earlier attempt showed), so the display must start over."""
        if self._caught_up or self._position >= len(self._shown.text):
            return False
        self._shown.text = self._shown.text[: self._position]
        return True


class StreamRelay:
    """Passes stream events to the callbacks until the call is abandoned, never repeating shown text."""

    def __init__(
        self,
        callbacks: Callbacks,
        signal: InterruptSignal,
        shown_text: ShownText | None = None,
        shown_reasoning: ShownText | None = None,
    ) -> None:
        self._callbacks = callbacks
        self._signal = signal
        self._thinking = False
        self._text = (shown_text or ShownText()).attempt()
        self._reasoning = (shown_reasoning or ShownText()).attempt()

    def start(self) -> None:
        self._thinking = True
        self._callbacks.emit("thinking_callback", True)

    def stop(self) -> None:
        if self._thinking:
            self._thinking = False
            self._callbacks.emit("thinking_callback", False)

    def on_text(self, delta: str) -> None:
        if self._signal.is_set():
            return
        fresh, restart = self._text.new_part(delta)
        if restart:
            self._callbacks.emit(
                "status_callback",
                "stream_restart",
                "the retried answer differs: it is shown again from the start",
            )
        if fresh:
            self.stop()
            self._callbacks.emit("stream_delta_callback", fresh)

    def finish(self) -> None:
        """The reply is complete: if it said less than an earlier attempt showed, start the display over."""
        if self._text.settle():
            self._callbacks.emit("status_callback", "stream_restart", _RESTART)
            shown = self._text.shown
            if shown:
                self._callbacks.emit("stream_delta_callback", shown)

    def on_reasoning(self, delta: str) -> None:
        if self._signal.is_set():
            return
        fresh, _ = self._reasoning.new_part(delta)
        if fresh:
            self._callbacks.emit("reasoning_callback", fresh)

    def on_tool_call(self, name: str) -> None:
        if not self._signal.is_set():
            self.stop()
            self._callbacks.emit("tool_gen_callback", name)
