"""AnswerStream: one run's reply, passed on piece by piece as the model writes it.

The reply is the text of every model call of the run, in order, a blank line between calls: what the
model writes before it calls a tool ("Let me look at that") is streamed as it comes, so it is part of
the reply too (it cannot be known to precede a tool call until the call ends). A plain reply is built
the same way, so a streamed reply and a plain one are the same text. A run that asks for approval
first replies with what it said so far and the question (`cut`); what it says after the answer is the
reply to the answering message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

SEPARATOR = "\n\n"


def joined(*parts: str) -> str:
    """The non-empty parts, a blank line between them."""
    return SEPARATOR.join(part for part in parts if part)


class AnswerStream:
    """Collects one run's text and passes it on to `on_delta` as it grows (None: nobody streams).

    Args:
        on_delta: called (on the run's worker thread) with each new piece of the reply.
        preface: text the reply starts with (a note about the channel's previous run).
    """

    def __init__(self, on_delta: Callable[[str], None] | None, preface: str = "") -> None:
        self._on_delta = on_delta
        self._calls: list[str] = [preface] if preface else []
        self._current: list[str] = []
        self._sent = ""
        self._diverged = False
        self._lock = threading.Lock()

    def callbacks(self) -> dict[str, Any]:
        """The AIAgent callbacks that feed this stream."""
        return {
            "stream_delta_callback": self._delta,
            "step_callback": self._step,
            "status_callback": self._status,
        }

    def _text(self) -> str:
        return joined(*self._calls, "".join(self._current))

    def _delta(self, text: str) -> None:
        with self._lock:
            self._current.append(text)
            self._forward()

    def _status(self, kind: str, message: str) -> None:
        if kind == "stream_restart":  # the call starts over after a retry: its text comes again whole
            with self._lock:
                self._current = []

    def _step(self, info: dict[str, Any]) -> None:
        with self._lock:
            call = "".join(self._current)
            self._current = []
            if call:
                self._calls.append(call)

    def _forward(self) -> None:
        """Pass on what the reply gained since the last piece; a reply that changed what was already sent
        (a retried call that said something else) is not streamed further."""
        text = self._text()
        if self._diverged or self._on_delta is None or text == self._sent:
            return
        if not text.startswith(self._sent):
            self._diverged = True
            return
        piece, self._sent = text[len(self._sent) :], text
        self._on_delta(piece)

    def cut(self) -> str:
        """The run asks a question: what it said so far goes out with it; the rest is another reply."""
        with self._lock:
            said = self._text()
            self._calls, self._current, self._sent = [], [], ""
            self._on_delta = None
            return said

    def reply(self, final: str) -> str:
        """After the run: the whole reply (since a `cut`), the final answer included even where it was not
        streamed (streaming off, say); what of it was not streamed yet is passed on."""
        with self._lock:
            if final and (self._calls[-1:] != [final] or self._current):
                last = "".join(self._current)
                self._current = []
                if last and last != final:
                    self._calls.append(last)
                self._calls.append(final)
            self._forward()
            return self._text()
