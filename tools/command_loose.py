"""A second, looser reading of a command the grammar could not parse whole.

A parse error already makes a command "ask"; this reading keeps a hardline command behind the error
(`{rm,-rf,/}`, a stray quote after `rm -rf /`) from running under --yolo. Words are split on blanks
and shell operators, quotes removed and braces expanded; each run of words is judged like a command,
and only hardline findings are kept (the looseness must not invent anything milder).
"""

from __future__ import annotations

import re
import shlex

from mibyan.tools.command_reader import brace_expand, decode_escapes
from mibyan.tools.command_words import Judge, Word
from mibyan.tools.verdict import Verdict

_OPERATORS = set(";&|()\n{}`")


def _tokens(text: str) -> list[str]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()\n`")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: read the plain words
        return re.split(r"[\s'\"]+|([;&|()`\n])", text)


def loose_verdicts(judge: Judge, text: str) -> list[Verdict]:
    text = re.sub(r"\$'((?:[^'\\]|\\.)*)'", lambda m: shlex.quote(decode_escapes(m.group(1))), text)
    text = re.sub(r"\$\{IFS\}|\$IFS\b", " ", text)
    home = str(judge.user_home)
    text = re.sub(r"\$\{HOME\}|\$HOME\b", home, text)
    text = re.sub(r"(?<![^\s=:'\"])~(?=/|\s|$|['\"])", home, text)
    words: list[Word] = []
    runs: list[list[Word]] = []
    found: list[Verdict] = []
    for token in _tokens(text):
        if not token:
            continue
        if set(token) <= _OPERATORS:
            runs.append(words)
            words = []
            continue
        if any(c in token for c in " \t\n;|&"):
            # a quoted string may be code for a shell the broken tree hid (`sh -c`, `| sh`, a heredoc)
            inner = judge.script(token)
            if inner.tier == "hardline":
                found.append(inner)
        for chars in brace_expand([(c, False) for c in token]):
            words.append(Word("".join(c for c, _ in chars).lstrip("{").rstrip("}") or "{}"))
    runs.append(words)
    for run in runs:
        for start in range(min(len(run), 4)):
            verdict = judge.run(run[start:])
            if verdict.tier == "hardline":
                found.append(verdict)
                break
    return found
