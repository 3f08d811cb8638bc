"""Questions the agent asks the person at the terminal: approvals and clarifications.

They read the terminal itself (/dev/tty), so they work while stdin is a pipe (`-q -`); where there is
no terminal the callbacks are not installed, and the agent denies what needs approval.
"""

from __future__ import annotations

import sys
from typing import Any

_ANSWERS = {
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


def ask_terminal(question: str) -> str | None:
    """Write `question` to the terminal and read one line back; None without a terminal."""
    try:  # two handles: a terminal opened "r+" in text mode is refused as not seekable
        with open("/dev/tty", "w", encoding="utf-8") as out, open("/dev/tty", encoding="utf-8") as answer:
            out.write(question)
            out.flush()
            line = answer.readline()
    except OSError:
        return None
    return line.strip() if line else None


def ask_approval(command: str, reason: str) -> str:
    shown = command if len(command) < 400 else command[:400] + "…"
    answer = ask_terminal(
        f"\n  ⚠ This command {reason}:\n      {shown}\n  Run it? [o]nce, [s]ession, [a]lways, [d]eny: "
    )
    return _ANSWERS.get((answer or "").lower(), "deny")


def ask_clarify(question: str, choices: list[str] | None) -> str:
    options = "".join(f"\n    {i}. {choice}" for i, choice in enumerate(choices or [], start=1))
    answer = ask_terminal(f"\n  ? {question}{options}\n  > ") or ""
    if choices and answer.isdigit() and 1 <= int(answer) <= len(choices):
        return choices[int(answer) - 1]
    return answer


def prompt_callbacks() -> dict[str, Any]:
    """The approval and clarify callbacks, when a person is at a terminal to answer them."""
    if not terminal_available() or not sys.stderr.isatty():
        return {}
    return {"approval_callback": ask_approval, "clarify_callback": ask_clarify}
