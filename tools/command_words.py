"""The vocabulary the command judge and its rules share: words, what a command reads, and verdicts.

A `Word` is one argument as the shell will pass it, as far as it can be known before the command runs:
quotes and escapes resolved, `~` and `$HOME` expanded. Parts that are only known at run time make the
word `dynamic`; when the command itself says which values they may take (`a=rm; $a`, `$(echo rm)`, a
`for` list) those values are its `guesses`, which the judge tries in turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mibyan.tools.verdict import SAFE, Verdict

if TYPE_CHECKING:
    from mibyan.tools.command_files import Contents


@dataclass(frozen=True)
class Word:
    """One argument: its static reading, whether part of it is computed at run time, and its guesses."""

    text: str
    dynamic: bool = False
    pattern: bool = False
    guesses: tuple[str, ...] = ()


def static(text: str) -> Word:
    return Word(text)


@dataclass(frozen=True)
class Stream:
    """Standard input that another command writes while this one runs (`curl ... | sh`).

    `guesses` are texts it may be, when the writer's words have guesses (`c=...; echo "$c" | sh`).
    A file redirected to standard input (`sh < FILE`) has the source "<" and its `path` ("" when only
    known at run time).
    """

    source: str
    guesses: tuple[str, ...] = ()
    path: str = ""


#: What a command reads on standard input: text known in advance (a heredoc, `echo ... |`), a stream
#: from another command, or nothing the judge knows of.
Feed = str | Stream | None


class Judge(Protocol):
    """What a rule may ask of the judge: to judge inner scripts, inner commands and write targets."""

    home: Path
    user_home: Path
    cwd: Path  # where the command starts
    cwd_unknown: bool  # the command cd's into a folder only known when it runs
    gateway: bool  # a gateway agent's command: whoever approves it does not own this machine

    def script(self, text: str, feed: Feed = None) -> Verdict:
        """Judge `text` as a shell script (an `sh -c` string, an `eval`, a heredoc fed to a shell)."""
        ...

    def script_at(self, text: str, feed: Feed = None) -> tuple[Verdict, int | None]:
        """`script`, and the line (from 1) of the statement that carries the verdict, when known."""
        ...

    def read_script(self, path: Path) -> Contents:
        """The text of a script file the command runs (read once per judgement, within a total)."""
        ...

    def enter_script(self, key: tuple[str, Path]) -> bool:
        """Start judging a script file; False when it is already being judged (it runs itself)."""
        ...

    def leave_script(self, key: tuple[str, Path]) -> None:
        """The script file `key` is judged."""
        ...

    def secrets(self, args: Sequence[Word], *, opens: bool = True) -> list[Verdict]:
        """Findings for arguments naming a place that holds secrets (or, for a gateway agent, a part
        of the home not its own, or a file only known when it runs, unless the command `opens` none)."""
        ...

    def run(self, words: Sequence[Word], feed: Feed = None) -> Verdict:
        """Judge a command that another one runs (a wrapper's, `find -exec`'s, `xargs`'s)."""
        ...

    def write(self, word: Word, action: str) -> Verdict:
        """Judge `word` as a file the command writes, deletes or changes (`action` names how)."""
        ...

    def wrote(self, word: Word, content: Feed, *, append: bool = False) -> None:
        """Remember that the command writes `content` (a Stream when unknown) to the file `word`."""
        ...

    def written(self, word: Word) -> Feed:
        """What the command wrote earlier to the file `word`: text, a Stream when unknown, else None."""
        ...

    def protected(self, path: Path) -> str | None:
        """Why `path` is one of mibyan's own files (tools/protected.py), or None."""
        ...

    def resolve(self, text: str) -> list[Path]:
        """The absolute paths a static path may mean (relative ones against every directory cd'd to)."""
        ...

    def real(self, path: Path) -> Path:
        """The absolute `path` with its links followed as far as they exist (a link in the project
        towards `~/.ssh` is where it leads)."""
        ...


def combine(verdicts: Iterable[Verdict]) -> Verdict:
    """The verdict of several findings: the first hardline one, else every distinct dangerous kind joined.

    Joined kinds keep grants narrow: "git_force_push+rm_recursive" is approved only by that answer or by
    approvals of both kinds, never by one of them.
    """
    dangerous: list[Verdict] = []
    for verdict in verdicts:
        if verdict.tier == "hardline":
            return verdict
        if verdict.tier == "dangerous" and all(v.key != verdict.key for v in dangerous):
            dangerous.append(verdict)
    if not dangerous:
        return SAFE
    if len(dangerous) == 1:
        return dangerous[0]
    keys = sorted({part for v in dangerous for part in v.key.split("+")})
    reasons = [v.reason for v in dangerous]
    reason = " and ".join(reasons[:3]) + (", and more" if len(reasons) > 3 else "")
    every_time = any(v.ask_every_time for v in dangerous)  # joined, a kind that always asks still does
    return Verdict("dangerous", reason, "+".join(keys), ask_every_time=every_time)


def command_name(word: Word) -> str:
    """The name a command is judged by: its base name, lower-cased (macOS finds `RM` as `rm`)."""
    return word.text.rsplit("/", 1)[-1].lower()
