"""Plain-text progress for one-shot runs: the answer streams to stdout, everything else to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from mibyan.core.sanitize import for_stream, visible

_ARGS_PREVIEW = 80


def preview_arguments(raw: Any) -> str:
    """A tool call's arguments in one short line."""
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
        text = ", ".join(f"{k}={v!r}" for k, v in parsed.items()) if isinstance(parsed, dict) else str(raw)
    except (ValueError, TypeError):
        text = str(raw)
    shown = text if len(text) <= _ARGS_PREVIEW else text[: _ARGS_PREVIEW - 1] + "…"
    return visible(shown)


class Progress:
    """The callbacks of a plain terminal run."""

    def __init__(self, *, quiet: bool, stream_answer: bool) -> None:
        self.quiet = quiet
        self.stream_answer = stream_answer
        self.streamed_answer = False
        self._mid_line = False
        self._deferred: list[str] = []

    def callbacks(self) -> dict[str, Any]:
        callbacks: dict[str, Any] = {}
        if self.stream_answer:
            callbacks["stream_delta_callback"] = self.on_delta
        if not self.quiet:
            callbacks["tool_progress_callback"] = self.on_tool
        if self.stream_answer or not self.quiet:
            callbacks["status_callback"] = self.on_status
        return callbacks

    def on_delta(self, text: str) -> None:
        self.streamed_answer = True
        self._mid_line = not text.endswith("\n")
        sys.stdout.write(for_stream(sys.stdout, text))
        sys.stdout.flush()

    def end_answer(self) -> None:
        if self._mid_line:
            sys.stdout.write("\n")
            sys.stdout.flush()
        self._mid_line = False
        for line in self._deferred:
            sys.stderr.write(visible(line) + "\n")
        self._deferred.clear()

    def _note(self, line: str) -> None:
        if self._mid_line:
            # the model said something before calling tools: finish its line first
            self.end_answer()
        sys.stderr.write(visible(line) + "\n")
        sys.stderr.flush()

    def on_tool(self, phase: str, name: str, detail: dict[str, Any]) -> None:
        if phase == "end":
            status = "interrupted" if detail.get("interrupted") else "ok" if detail.get("ok") else "failed"
            self._note(
                f"  ⚙ {name}({preview_arguments(detail.get('arguments'))}) · {status} · "
                f"{detail.get('duration', 0):.1f}s"
            )

    def on_status(self, kind: str, message: str) -> None:
        if kind == "stream_restart" and self.streamed_answer:
            # what was shown cannot be taken back: a visible break, then the answer again in full
            self.end_answer()
            sys.stdout.write("[the connection dropped; the answer again:]\n")
            sys.stdout.flush()
        elif self.quiet or kind == "interrupted":
            return
        elif kind == "retry" and self._mid_line:
            # a retry mid-answer goes on where the answer was cut: the note waits for the answer's end
            self._deferred.append(f"  · {message}")
        else:
            self._note(f"  · {message}")
