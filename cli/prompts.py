"""Questions the agent asks the person at the terminal: approvals and clarifications.

They read the terminal itself (/dev/tty), so they work while stdin is a pipe (`-q -`); where there is
no terminal the callbacks are not installed, and the agent denies what needs approval. The chat can
cancel a question (Ctrl-C): it ends at once, answered as a refusal, and stops reading the terminal.
"""

from __future__ import annotations

import os
import re
import select
import sys
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from mibyan.core.sanitize import visible
from mibyan.tools.approval import Answer, ApprovalRequest, Approver

_ANSWERS: dict[str, Answer] = {
    "o": "once",
    "once": "once",
    "y": "once",
    "yes": "once",
    "s": "session",
    "session": "session",
    "a": "always",
    "always": "always",
    "d": "deny",
    "deny": "deny",
    "n": "deny",
    "no": "deny",
}


def terminal_available() -> bool:
    try:
        with open("/dev/tty", "rb"):
            return True
    except OSError:
        return False


class TerminalQuestions:
    """Questions at the terminal that can be cancelled from another thread (the chat's Ctrl-C)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wakers: set[int] = set()

    def ask(self, question: str) -> str | None:
        """Write `question` to the terminal and read one line back.

        Returns:
            The line without surrounding blanks; None without a terminal, at end of input, or when
            `cancel()` ended the question.
        """
        try:
            terminal = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        except OSError:
            return None
        wake_read, wake_write = os.pipe()
        with self._lock:
            self._wakers.add(wake_write)
        try:
            os.write(terminal, question.encode("utf-8", "replace"))
            line = self._read_line(terminal, wake_read)
        except OSError:
            line = None
        finally:
            with self._lock:
                self._wakers.discard(wake_write)
            for fd in (terminal, wake_read, wake_write):
                os.close(fd)
        return line.decode("utf-8", "replace").strip() if line else None

    @staticmethod
    def _read_line(terminal: int, wake: int) -> bytes | None:
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([terminal, wake], [], [])
            if wake in ready:  # cancelled: end the question's line so what follows starts afresh
                os.write(terminal, b"\n")
                return None
            chunk = os.read(terminal, 4096)
            if not chunk:
                break
            line += chunk
        return line

    def cancel(self) -> bool:
        """End every question being asked now, as if the person had refused; whether one was."""
        with self._lock:
            for fd in self._wakers:
                os.write(fd, b"x")
            return bool(self._wakers)

    def callbacks(self) -> dict[str, Any]:
        """The approval and clarify callbacks, when a person is at a terminal to answer them."""
        if not terminal_available() or not sys.stderr.isatty():
            return {}
        return {
            "approval_callback": Approver(partial(ask_approval, read=self.ask)),
            "clarify_callback": partial(ask_clarify, read=self.ask),
        }


def ask_terminal(question: str) -> str | None:
    """Write `question` to the terminal and read one line back; None without a terminal."""
    return TerminalQuestions().ask(question)


_LONG_BLANK = re.compile(r"[ \t]{8,}")
_BLANK_LINES = re.compile(r"\n(?:[ \t]*\n){3,}")


def _shown(command: str) -> str:
    """The command with long runs of blanks named instead of drawn: thousands of spaces or empty lines
    would push the start of the command off the screen, above the question."""
    command = _BLANK_LINES.sub(lambda m: f"\n‹{m.group().count(chr(10)) - 1} empty lines›\n", command)
    return _LONG_BLANK.sub(lambda m: f"‹{len(m.group())} blanks›", command)


def approval_question(command: str, reason: str) -> str:
    """The approval question: the whole command, on as many lines as it has, each made visible (an
    escape sequence in it cannot hide a line or rewrite what is shown), then the reason as a sentence."""
    lines = "".join(f"\n      {visible(line)}" for line in _shown(command).split("\n"))
    because = visible(reason).rstrip(". ")
    return (
        f"\n  ⚠ mibyan asks before running this:{lines}\n  This command {because}.\n"
        "  Run it? [o]nce, [s]ession, [a]lways, [d]eny: "
    )


def ask_approval(request: ApprovalRequest, *, read: Callable[[str], str | None] = ask_terminal) -> Answer:
    answer = read(approval_question(request.subject, request.reason))
    return _ANSWERS.get((answer or "").lower(), "deny")


def ask_clarify(
    question: str, choices: list[str] | None, *, read: Callable[[str], str | None] = ask_terminal
) -> str:
    options = "".join(f"\n    {i}. {visible(choice)}" for i, choice in enumerate(choices or [], start=1))
    asked = "\n    ".join(visible(line) for line in question.split("\n"))
    answer = read(f"\n  ? {asked}{options}\n  > ") or ""
    if choices and answer.isdigit() and 1 <= int(answer) <= len(choices):
        return choices[int(answer) - 1]
    return answer


def prompt_callbacks() -> dict[str, Any]:
    """The approval and clarify callbacks, when a person is at a terminal to answer them."""
    return TerminalQuestions().callbacks()
