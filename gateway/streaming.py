"""AnswerStream: the answer's text deltas, without the text of steps that ended in tool calls.

The model may write a few words before it calls a tool ("Let me look at that"); that text is part of
the history but not of the answer. Deltas are therefore held per model call and passed on when the call
turns out to be the final one, so a streamed reply is exactly the text of the plain reply.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class AnswerStream:
    """Collects one run's deltas and passes the answer's on to `on_delta` (None: nobody streams)."""

    def __init__(self, on_delta: Callable[[str], None] | None) -> None:
        self._on_delta = on_delta
        self._held: list[str] = []
        self._sent: list[str] = []
        self._lock = threading.Lock()

    def callbacks(self) -> dict[str, Any]:
        """The AIAgent callbacks that feed this stream (none when nobody streams)."""
        if self._on_delta is None:
            return {}
        return {"stream_delta_callback": self._hold, "step_callback": self._step}

    def _hold(self, text: str) -> None:
        with self._lock:
            self._held.append(text)

    def _step(self, info: dict[str, Any]) -> None:
        with self._lock:
            held, self._held = self._held, []
            if info.get("tools"):
                return  # the words before a tool call are not the answer
        for piece in held:
            self._send(piece)

    def _send(self, piece: str) -> None:
        if piece and self._on_delta is not None:
            self._sent.append(piece)
            self._on_delta(piece)

    def finish(self, final: str) -> None:
        """After the run: send what of the final answer was not streamed (a summary after the budget)."""
        sent = "".join(self._sent)
        if final.startswith(sent):
            self._send(final[len(sent) :])
