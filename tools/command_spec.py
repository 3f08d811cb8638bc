"""A program as data: which of its options take values, carry code or name files, and what its operands are.

Every program the command judge knows is one `Spec` (tools/command_table.py): the options that take a
value, the options whose value is shell code (`flock -c`, `su -c`) or a file it writes (`dd of=`,
`curl -o`), what its operands are (files it writes or deletes, a command it runs after its own options,
shell text), and, for what no role can say (rm's broad folders, git's subcommands), one `check` that
sees the scanned words. One scanner, `scan`, reads the words of every program the same way; each spec
carries `should_match` and `should_not_match` examples beside it, which one test judges.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from mibyan.tools.command_words import Feed, Judge, Word, combine
from mibyan.tools.verdict import SAFE, Tier, Verdict

#: What a program's operands are: files it reads (and so changes nothing, secrets aside) or writes or
#: deletes (`action` says how), the command it runs after its own options (a wrapper), or shell text
#: it runs (`watch`); "" when the roles say nothing.
Role = Literal["", "reads", "writes", "deletes", "runs", "script"]


@dataclass(frozen=True)
class Scan:
    """A program's words as its option parser reads them.

    Attributes:
        args: the words after the program's name.
        flags: every option given, clustered letters one by one (`-rf`: `-r`, `-f`), long ones by name.
        values: the values of the options that take one, in order (`-u root`, `-uroot`, `--user=root`,
            and `of=x` for an option spelled with `=`).
        operands: the words that are neither options nor their values.
        start: for a program that runs a command, the index in `args` of that command's first word.
    """

    args: list[Word]
    flags: frozenset[str]
    values: dict[str, list[Word]]
    operands: list[Word]
    start: int

    def value(self, *options: str) -> Word | None:
        """The first value given to any of `options`."""
        return next((v for o in options for v in self.values.get(o, ())), None)

    def given(self, *options: str) -> list[Word]:
        """Every value given to any of `options`."""
        return [v for o in options for v in self.values.get(o, ())]


#: What a spec checks beyond its roles, given the scanned words and the program's standard input.
Check = Callable[[Judge, str, Scan, Feed], Verdict]


@dataclass(frozen=True)
class Spec:
    """One program (or a family of programs that read their words alike).

    Attributes:
        names: the command names it is judged for.
        valued: options that take a value (`-u`, `--user`; `of=` for an option spelled NAME=VALUE).
        code: options whose value is shell code the program runs.
        writes: options whose value is a file the program writes.
        operands: what the operands are (see `Role`); `action` says how a "writes" operand is changed.
        skip: operands a wrapper takes before the command it runs (`timeout 5 CMD`).
        ordered: its options end at its first operand after the `skip` ones (`ssh HOST CMD`, `xargs
            CMD`), as for every program that runs a command or shell text; `Scan.start` is there.
        harmless: options that make the program run and change nothing (`command -v`, `crontab -l`).
        elevates: it runs its command as root.
        check: what the roles cannot say, judged from the scanned words.
        should_match: commands this spec makes ask or refuse, each with its tier.
        should_not_match: commands it lets run unasked.
    """

    names: tuple[str, ...]
    valued: frozenset[str] = frozenset()
    code: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    operands: Role = ""
    action: str = "writes to"
    skip: int = 0
    ordered: bool = False
    harmless: frozenset[str] = frozenset()
    elevates: bool = False
    check: Check | None = None
    should_match: tuple[tuple[str, Tier], ...] = ()
    should_not_match: tuple[str, ...] = field(default=())


def spec(
    names: str,
    *,
    valued: str = "",
    code: str = "",
    writes: str = "",
    harmless: str = "",
    should_match: dict[str, Tier] | None = None,
    should_not_match: Sequence[str] = (),
    **rest: object,
) -> Spec:
    """A `Spec` written briefly: names and option sets as space-separated words."""
    words = frozenset[str]
    return Spec(
        names=tuple(names.split()),
        valued=words(valued.split()) | words(code.split()) | words(writes.split()),
        code=words(code.split()),
        writes=words(writes.split()),
        harmless=words(harmless.split()),
        should_match=tuple((should_match or {}).items()),
        should_not_match=tuple(should_not_match),
        **rest,  # type: ignore[arg-type]
    )


def scan(program: Spec, args: Sequence[Word]) -> Scan:
    """Read `args` as the program's option parser would: the one scanner every spec is read by.

    Options may follow operands (GNU programs permute), except for a program that runs a command or
    shell text: its options end at the first operand (after the `skip` ones it takes first), and what
    follows is the command. `--` ends the options.
    """
    words = list(args)
    reader = _Reader(program, words)
    stops = program.ordered or program.operands in ("runs", "script")
    i = 0
    taken = 0  # operands consumed by a wrapper before its command
    while i < len(words):
        text = words[i].text
        if text == "--" and not reader.ended:
            reader.ended = True
            i += 1
            continue
        if reader.ended or not text.startswith("-") or text == "-":
            if stops and taken >= program.skip:
                break
            taken += 1
            reader.operand(words[i])
            i += 1
            continue
        i = reader.option(i)
    start = min(i, len(words))
    operands = [*reader.operands, *words[start:]] if stops else reader.operands
    return Scan(words, frozenset(reader.flags), reader.values, operands, start)


class _Reader:
    """The state of one scan: what has been read so far."""

    def __init__(self, program: Spec, words: list[Word]) -> None:
        self.program = program
        self.words = words
        self.flags: set[str] = set()
        self.values: dict[str, list[Word]] = {}
        self.operands: list[Word] = []
        self.ended = False

    def _keep(self, option: str, value: Word) -> None:
        self.values.setdefault(option, []).append(value)

    def operand(self, word: Word) -> None:
        head, eq, _ = word.text.partition("=")
        if eq and head + "=" in self.program.valued:  # `dd of=FILE`
            self._keep(head + "=", _after(word, len(head) + 1))
        else:
            self.operands.append(word)

    def option(self, i: int) -> int:
        """Read the option at `i` (and its value); returns the index after them."""
        word = self.words[i]
        text = word.text
        valued = self.program.valued
        if text.startswith("--") or (text in valued and len(text) > 2):  # `--user=x`, `find -name x`
            name, eq, _ = text.partition("=")
            self.flags.add(name)
            if eq:
                self._keep(name, _after(word, len(name) + 1))
            elif name in valued and i + 1 < len(self.words):
                self._keep(name, self.words[i + 1])
                return i + 2
            return i + 1
        for position, letter in enumerate(text[1:], start=1):
            option = f"-{letter}"
            self.flags.add(option)
            if option not in valued:
                continue
            if position + 1 < len(text):
                self._keep(option, _after(word, position + 1))
            elif i + 1 < len(self.words):
                self._keep(option, self.words[i + 1])
                return i + 2
            break
        return i + 1


def _after(word: Word, at: int) -> Word:
    """The part of `word` from character `at` on (an option's attached value), guesses cut alike."""
    return Word(word.text[at:], word.dynamic, word.pattern, tuple(g[at:] for g in word.guesses))


def code_word(j: Judge, word: Word, feed: Feed, what: str) -> Verdict:
    """Judge a word holding shell code: as a script, or by its guesses when only known when it runs."""
    if not word.dynamic:
        return j.script(word.text, feed)
    for guess in word.guesses:
        verdict = j.script(guess, feed)
        if verdict.tier == "hardline":
            return verdict
    return Verdict("dangerous", f"runs {what} that is only known when it runs", "dynamic_command")


def sudo(name: str) -> Verdict:
    return Verdict("dangerous", f"runs a command as root ({name})", "sudo")


def judge_spec(program: Spec, j: Judge, name: str, args: Sequence[Word], feed: Feed) -> Verdict:
    """Judge one command by its program's spec: its roles, then its check."""
    found = scan(program, args)
    if program.harmless & found.flags:
        return SAFE
    findings = [code_word(j, w, feed, f"shell code ({name})") for w in found.given(*program.code)]
    findings += [j.write(w, "writes to") for w in found.given(*program.writes)]
    role = program.operands
    if role == "writes" or role == "deletes":
        findings += [j.write(w, program.action if role == "writes" else "deletes") for w in found.operands]
    elif role == "runs":  # `flock F -c CODE` runs the code instead, and leaves nothing here
        findings.append(j.run(found.args[found.start :], feed))
    elif role == "script" and found.args[found.start :]:
        findings.append(j.script(" ".join(w.text for w in found.args[found.start :]), feed))
    if program.elevates:
        findings.append(sudo(name))
    if program.check is not None:
        findings.append(program.check(j, name, found, feed))
    return combine(findings)
