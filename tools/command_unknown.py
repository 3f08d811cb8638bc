"""A program the judge has no spec for: judged by what its arguments may make it do.

It may be a wrapper the table does not list (`chrt -f 1 CMD`, `setarch x86_64 CMD`, `cgexec -g x CMD`):
wherever its arguments hold a program the judge knows followed by arguments, the rest is judged as a
command it may run, so no wrapper makes a hardline command less than hardline. What is only uncertain
about such a reading (a script file of that name that does not exist: `apt install python3 git`) is
left out. And whatever it is, an argument naming a place whose content runs by itself later or grants
access (a shell's start-up file, `~/.ssh`, a crontab, a systemd unit, a git hook, mibyan's own files)
may be a file it writes: asked, as a write there through a known writer is. An argument that reads as
a command line (`tmux new -d '...'`) is judged as one too, keeping only what never runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from mibyan.tools.command_paths import runs_by_itself
from mibyan.tools.command_words import Feed, Judge, Word, combine, command_name
from mibyan.tools.verdict import SAFE, Verdict

_MAX_READINGS = 8  # places in one command's arguments read as the command it may run
#: Kinds of finding that come only from reading an argument as a command it may not be.
_UNCERTAIN = ("unreadable_script", "dynamic_command", "dynamic_write", "dynamic_path", "pipe_to_shell")


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


def _may_run(j: Judge, word: Word, followed: bool, known: Callable[[str], bool]) -> bool:
    """Whether `word` may be a command the unknown program runs: a program the judge knows, followed by
    arguments, or a program file on disk (`./x.sh`), which the judge reads."""
    if known(command_name(word)):
        return followed
    return "/" in word.text and any(os.access(p, os.X_OK) and p.is_file() for p in j.resolve(word.text))


def _readings(j: Judge, args: Sequence[Word], known: Callable[[str], bool]) -> list[list[Word]]:
    """The commands the arguments may hold: from a known program (or program file) on, a known name
    guessed for a word only known when it runs (`"$(echo rm)" -rf /`), or after an option's `=`
    (`--exec=rm -rf /`)."""
    found: list[list[Word]] = []
    for i, word in enumerate(args):
        followed = i < len(args) - 1
        if word.dynamic:
            guesses = [g for g in word.guesses if known(command_name(Word(g)))]
            found += [[Word(g), *args[i + 1 :]] for g in guesses[:2] if followed]
        elif _may_run(j, word, followed, known):
            found.append(list(args[i:]))
        elif word.text.startswith("-") and "=" in word.text:
            value = Word(word.text.partition("=")[2])
            if value.text and _may_run(j, value, followed, known):
                found.append([value, *args[i + 1 :]])
    return found[:_MAX_READINGS]


def _wrapped(j: Judge, name: str, args: Sequence[Word], feed: Feed, known: Callable[[str], bool]) -> Verdict:
    findings: list[Verdict] = []
    for words in _readings(j, args, known):
        inner = j.run(words, feed)
        if inner.tier == "hardline":
            return inner
        program = not known(command_name(words[0]))  # a program file: only what never runs counts
        if (
            inner.tier == "dangerous"
            and not program
            and not any(k in _UNCERTAIN for k in inner.key.split("+"))
        ):
            reason = f"may run a command that {inner.reason} ({name}, which mibyan has no rule for)"
            findings.append(Verdict("dangerous", reason, inner.key, inner.ask_every_time))
    return combine(findings)


def _shell_text(j: Judge, args: Sequence[Word]) -> Verdict:
    """An argument that reads as a command line (`tmux new 'rm -rf /'`, `sg grp -c '...'`) may be one the
    program hands to a shell: what would never run as such never runs here either."""
    for word in args:
        if not word.dynamic and any(c in word.text for c in " \t;|&\n"):
            verdict = j.script(word.text)
            if verdict.tier == "hardline":
                return verdict
    return SAFE


def judge_unknown(
    j: Judge, name: str, args: Sequence[Word], feed: Feed, known: Callable[[str], bool]
) -> Verdict:
    """Judge a command whose program the judge has no spec for; `known` tells the programs it has."""
    found = [_wrapped(j, name, args, feed, known), _shell_text(j, args), _named_places(j, name, args)]
    return combine(found)
