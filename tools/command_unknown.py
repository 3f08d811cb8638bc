"""A program the judge has no spec for: judged by what its arguments may make it do.

Whatever it is, an argument naming a place whose content runs by itself later or grants access
(a shell's start-up file, `~/.ssh`, a crontab, a systemd unit, a git hook, mibyan's own files) may be
a file it writes: asked, as a write there through a known writer is.
"""

from __future__ import annotations

from collections.abc import Sequence

from mibyan.tools.approval import SAFE, Verdict
from mibyan.tools.command_paths import runs_by_itself
from mibyan.tools.command_words import Judge, Word, combine


def _named_places(j: Judge, name: str, args: Sequence[Word]) -> Verdict:
    for word in args:
        if word.dynamic:
            continue
        text = word.text.partition("=")[2] if word.text.startswith("-") else word.text
        if not text or ("/" not in text and not text.startswith(".")):
            continue
        for path in j.resolve(text):
            place = runs_by_itself(j, path)
            if place is not None:
                reason = f"may write {place} ({name}, a program mibyan has no rule for)"
                return Verdict("dangerous", reason, "sensitive_write")
    return SAFE


def judge_unknown(j: Judge, name: str, args: Sequence[Word]) -> Verdict:
    """Judge a command whose program the judge has no spec for."""
    return combine([_named_places(j, name, args)])
