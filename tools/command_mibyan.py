"""mibyan run by the model through the terminal: the commands that would hand it what only the user decides.

`mibyan trust` makes a project's configuration (its providers, hooks and approvals) apply; `--yolo` starts
an agent that runs dangerous commands without asking. Either, run by the model, would undo the approval
flow from inside, so both never run. Commands that change stored sessions or serve mibyan to others ask.
"""

from __future__ import annotations

from collections.abc import Sequence

from mibyan.tools.command_words import Word
from mibyan.tools.verdict import SAFE, Verdict

_CHANGES_SESSIONS = {"delete", "rename"}
_SERVES = {"gateway", "web", "acp"}


def is_mibyan_module(module: str) -> bool:
    """`python -m mibyan...` runs mibyan itself."""
    return module == "mibyan" or module.startswith("mibyan.")


def judge_mibyan(args: Sequence[Word]) -> Verdict:
    """Judge the arguments of a `mibyan` command line (after the program or module name).

    An argument computed at run time is judged by each value the judge could guess for it (`x=trust;
    mibyan $x`), and asks even when every guess is harmless.
    """
    readings = [[word.text for word in args]]
    for index, word in enumerate(args):
        for guess in word.guesses:
            readings.append([guess if i == index else w.text for i, w in enumerate(args)])
    verdicts = [_judge_texts(texts) for texts in readings]
    worst = next((v for v in verdicts if v.tier == "hardline"), None)
    if worst is not None:
        return worst
    if any(word.dynamic for word in args):
        return Verdict("dangerous", "runs mibyan with arguments computed at run time", "mibyan_command")
    return verdicts[0]


def _judge_texts(texts: list[str]) -> Verdict:
    if any(text == "--yolo" or text.startswith("--yolo=") for text in texts):
        return Verdict(
            "hardline",
            "starts a mibyan agent that runs dangerous commands without asking (--yolo)",
            "protected",
        )
    words = [text for text in texts if not text.startswith("-")]
    command = words[0] if words else ""
    if command == "trust" and texts[1:] != ["--list"]:
        return Verdict("hardline", "changes which projects mibyan trusts, which only you may do", "protected")
    if command == "sessions" and len(words) > 1 and words[1] in _CHANGES_SESSIONS:
        return Verdict("dangerous", f"{words[1]}s stored mibyan sessions", "mibyan_sessions")
    if command in _SERVES:
        return Verdict("dangerous", f"serves mibyan to others (mibyan {command})", "mibyan_serve")
    if command == "chat":
        return Verdict("dangerous", "starts another mibyan agent", "mibyan_agent")
    return SAFE
