"""The command judge: reads a shell command with bash's grammar and judges every command it would run.

The command is parsed by tree-sitter-bash, and the tree is walked whole. Each simple command is judged
wherever it sits: in pipelines and lists, subshells and groups, `$(...)`, backticks and `<(...)`,
function bodies, loops and `case` arms, heredocs. Its words are read the way bash reads them (quotes,
escapes, `$'...'`, brace expansion, `${IFS}` splitting, `~` and `$HOME`), then handed to the rules
(tools/command_rules.py), which look through wrappers and re-enter the judge for the code a command
runs: `sh -c` strings and `eval` (parsed in turn), text fed to a shell or interpreter on its standard
input (a heredoc, a here-string, `echo ... |`), `find -exec`, `xargs`, inline `python -c` code.

What cannot be known before the command runs is judged for what it may be: a command name computed at
run time (`$a`, `$(echo rm)`, `/bin/r?`) is its own kind, "dynamic_command", and the values the
command itself offers for it (`a=rm`, `for c in rm`, `$(printf ...)`, the environment the shell
inherits) are tried in turn, with the worst names the arguments fit (rm, dd), so that a hardline one
is caught; a write target only known at run time asks (and, for an agent of the gateway, any file
argument only known at run time; a path into /proc only known at run time asks every time). The
judge also remembers what the command writes to files and the folders it cd's into, so
`echo ... > x.sh; sh x.sh` is judged by the script; a script already on disk that it runs
(`bash x.sh`, `./run`, `python3 x.py`) is read and judged by its text (tools/command_files.py).

A parse error or a construct the judge does not know is "ask", never "safe"; a broken tree is also
read a second, looser way (tools/command_loose.py) so that a hardline command hidden behind a syntax
error still never runs. The command is judged once as written and once with Unicode folded (NFKC,
invisible characters and line continuations removed), and the worse reading wins. A command that
spends the judge's budget of work (guesses multiply) or nests deeper than Python's stack never runs,
nor does a command line longer than 64 KiB (`MAX_COMMAND_BYTES`): it goes in a script file.
"""

from __future__ import annotations

import fnmatch
import os
import re
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mibyan.tools.command_files import TOTAL_BYTES, Contents, read_file
from mibyan.tools.command_paths import judge_write_word
from mibyan.tools.command_reader import WordReader
from mibyan.tools.command_rules import KNOWN_NAMES, judge_invocation
from mibyan.tools.command_walk import UNREADABLE, Walk
from mibyan.tools.command_words import Feed, Stream, Word, combine, command_name
from mibyan.tools.judge_policy import JudgePolicy
from mibyan.tools.protected import OwnFiles
from mibyan.tools.verdict import SAFE, Tier, Verdict

if TYPE_CHECKING:
    from tree_sitter import Parser

#: The longest command line judged: beyond it, judging would hold a worker for seconds (and bash
#: could not be started with it past 128 KiB anyway). A script file of any size is read as a script.
MAX_COMMAND_BYTES = 64 * 1024
MAX_DEPTH = 8  # scripts inside scripts (`sh -c "eval '...'"`) deeper than this are not read: ask
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"))
_TOO_DEEP = Verdict("dangerous", "nests scripts too deeply for mibyan to read", "unreadable")

#: Commands and scripts judged for one command line, beyond one per character of it: guesses multiply
#: (16 shells, each `-c` a script with 16 more), and a command built to exhaust the judge must not run.
_BUDGET = 4000
_TOO_COMPLEX = Verdict(
    "hardline",
    "is too complex for mibyan to judge (it nests or repeats too much); split it up",
    "too_complex",
)


#: Commands that open no file their arguments name: a word only known when it runs is only text to them.
_OPENS_NO_FILES = frozenset({"echo", "printf", "true", "false", "test", "[", "expr", "seq", "sleep", "exit"})
#: A path into /proc partly only known when it runs (`/proc/$PPID/environ`): it may be the environment
#: or memory of any process, mibyan's own (which holds its API keys) included.
_PROCESS_FILE = re.compile(r"^/+proc(/|$)")
#: A path through a process's own links (`/proc/self/cwd/../..`, `/proc/1/root/...`, `/dev/fd/3/...`):
#: they lead where that process's folders are, which the judge cannot see from here.
_PROCESS_LINK = re.compile(
    r"(^|/)proc/+[^/]+/+(task/+[^/]+/+)?(cwd|root|map_files|fd/+[^/]+/+[^/])|(^|/)dev/+fd/+[^/]+/+[^/]"
)


_LEADING_SLASHES = re.compile(r"^//+")


def _shown(text: str) -> str:
    return text if len(text) <= 60 else text[:60] + "…"


class _TooComplex(Exception):
    """The judge's budget is spent."""


_FILLS = {"writes to", "writes into", "edits", "patches", "creates or changes"}


class _PerThread(threading.local):
    parser: Parser | None = None


_per_thread = _PerThread()  # tree-sitter parsers are not thread-safe, and tools run in a thread pool


def _parser() -> Parser:
    """This thread's parser, made on first use: importing tree-sitter waits until a command is judged."""
    if _per_thread.parser is None:
        import tree_sitter
        import tree_sitter_bash

        _per_thread.parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))
    return _per_thread.parser


def fold(command: str) -> str:
    """The command with the disguises that change nothing for a reader removed."""
    # ASCII has nothing to fold or make visible: translating char by char cost more than parsing
    text = command if command.isascii() else unicodedata.normalize("NFKC", command).translate(_INVISIBLE)
    return text.replace("\\\n", "")


class CommandJudge:
    """Judges one command line; `judge()` is the entry point. Implements the rules' `Judge` protocol."""

    def __init__(self, *, policy: JudgePolicy, cwd: Path, user_home: Path) -> None:
        self.home = policy.home
        self.user_home = user_home
        # the home, the running agent's hook modules (as off limits as its home), and for a gateway agent
        # its own folder (all of the home its commands may name), its workspace (where they run) and its
        # own temp folder (all of it they may write), each resolved once for this judgement
        self._own = OwnFiles(
            home=policy.home,
            extra=policy.protected,
            writable=policy.writable,
            agent_folder=policy.agent_folder,
        )
        self._agent_folder = policy.agent_folder
        self.gateway = policy.gateway
        # where the sandbox hides the home from its commands, a folder above the home holds nothing of it
        self._home_hidden = policy.home_hidden
        self.cwd = cwd
        self.cwds: list[Path] = [cwd]
        self.cwd_unknown = False
        self.depth = 0
        self.budget = _BUDGET
        self._protected: dict[Path, str | None] = {}
        self.files: dict[Path, Feed] = {}  # what the command writes to files before it may run them
        self.reader = WordReader(user_home=user_home, cwd=cwd)
        self._scripts: dict[Path, Contents] = {}  # the script files it runs, as read
        self._script_bytes = 0
        self._judging: set[tuple[str, Path]] = set()
        self._resolved: dict[tuple[str, int], tuple[Path, ...]] = {}

    # -- the Judge protocol ---------------------------------------------------------------------------

    def script(self, text: str, feed: Feed = None) -> Verdict:
        return self.script_at(text, feed)[0]

    def script_at(self, text: str, feed: Feed = None) -> tuple[Verdict, int | None]:
        self._spend()
        if self.depth >= MAX_DEPTH:
            return _TOO_DEEP, None
        self.depth += 1
        try:
            return self._judge_text(text, feed)
        finally:
            self.depth -= 1

    def read_script(self, path: Path) -> Contents:
        if path not in self._scripts:
            contents = read_file(path, room=TOTAL_BYTES - self._script_bytes)
            size = len(contents.text or "")
            self._script_bytes += size
            self.budget += size  # a long script is judged whole, as a long command line is
            self._scripts[path] = contents
        return self._scripts[path]

    def enter_script(self, key: tuple[str, Path]) -> bool:
        if key in self._judging:
            return False
        self._judging.add(key)
        return True

    def leave_script(self, key: tuple[str, Path]) -> None:
        self._judging.discard(key)

    def run(self, words: Sequence[Word], feed: Feed = None) -> Verdict:
        # every wrapper consumes a word, so this recursion ends without a depth count
        self._spend()
        return self._judge_words(list(words), feed) if words else SAFE

    def _spend(self) -> None:
        self.budget -= 1
        if self.budget < 0:
            raise _TooComplex

    def write(self, word: Word, action: str) -> Verdict:
        if action in _FILLS:
            self.wrote(word, None)  # what goes in is unknown unless the caller says (see remember_output)
        return judge_write_word(self, word, action, cwd_unknown=self.cwd_unknown)

    def wrote(self, word: Word, content: Feed, *, append: bool = False) -> None:
        if word.dynamic:
            return
        for path in self.resolve(word.text):
            before = self.files.get(path)
            if append and isinstance(before, str) and isinstance(content, str):
                content = before + content
            self.files[path] = content if content is not None else Stream("")

    def written(self, word: Word) -> Feed:
        if word.dynamic:
            return None
        return next((self.files[p] for p in self.resolve(word.text) if p in self.files), None)

    def enter(self, folders: list[Path]) -> None:
        """The script cd's into one of `folders`: relative paths may be meant from there too."""
        self.cwds.extend(f for f in folders if f not in self.cwds)

    def protected(self, path: Path) -> str | None:
        if path not in self._protected:  # resolving follows links on disk: once per path is enough
            self._protected[path] = self._own.protected(path, cwd=os.path.dirname(path))
        return self._protected[path]

    def real(self, path: Path) -> Path:
        return Path(self._own.real(path, cwd=os.path.dirname(path)))

    def resolve(self, text: str) -> list[Path]:
        # the same words are resolved again and again (a write target: judged, then remembered); the
        # folders cd'd to only grow, so their number tells whether an earlier answer still holds
        key = (text, len(self.cwds))
        found = self._resolved.get(key)
        if found is None:
            found = self._resolved[key] = _resolve(text, self.cwds)
        return list(found)

    # -- reading the command ----------------------------------------------------------------------------

    def _judge_text(self, text: str, feed: Feed) -> tuple[Verdict, int | None]:
        verdict, line = self._judge_reading(text, feed)
        folded = fold(text)
        if folded != text:
            other, other_line = self._judge_reading(folded, feed)
            if other.tier == "hardline" and verdict.tier != "hardline":
                line = other_line
            verdict = combine([verdict, other])
        return verdict, line

    def _judge_reading(self, text: str, feed: Feed) -> tuple[Verdict, int | None]:
        source = text.encode("utf-8", "surrogatepass")
        tree = _parser().parse(source)
        walk = Walk(self)
        outer = (self.reader.misread, self.reader.source, self.reader.cache)
        self.reader.misread, self.reader.source, self.reader.cache = False, source, {}
        walk.prepare(tree.root_node)
        lines = walk.statements(tree.root_node, feed)
        misread = self.reader.misread
        self.reader.misread, self.reader.source, self.reader.cache = outer
        if tree.root_node.has_error or misread:
            from mibyan.tools.command_loose import loose_verdicts

            walk.findings.append(UNREADABLE)
            walk.findings.extend(loose_verdicts(self, text))
        verdict = combine(walk.findings)
        return verdict, lines.get(verdict.tier)

    def _judge_words(self, words: list[Word], feed: Feed) -> Verdict:
        head = words[0]
        opens = head.dynamic or command_name(head) not in _OPENS_NO_FILES
        secrets = self.secrets(words[1:], opens=opens)
        if not (head.dynamic or head.pattern):
            return combine([judge_invocation(self, words, feed), *secrets])
        return combine([self._judge_dynamic(words, feed), *secrets])

    def secrets(self, args: Sequence[Word], *, opens: bool = True) -> list[Verdict]:
        """Arguments naming a place that holds secrets: the command asks every time, as read_file does.
        For a gateway agent, an argument naming a part of the home not its own never runs, and one
        only known when it runs (`$f`, `$(...)`) asks, unless the command opens no files (`opens`)."""
        found: list[Verdict] = []
        for word in args:
            text = word.text.rpartition("=")[2] if "=" in word.text else word.text
            if word.dynamic:
                found.extend(self._unknown(word, text, opens=opens))
                continue
            sealed = self._sealed(text, pattern=word.pattern)
            if sealed is not None:
                found.append(Verdict("hardline", f"reads or changes {sealed}", "sealed_home"))
                continue
            above = self._above_home(text) if opens else None
            if above is not None:
                found.append(above)
            if not ("/" in text or text.startswith((".env", ".netrc"))):
                continue
            if _PROCESS_LINK.search(text):
                found.append(self._secret(f"{_shown(text)}, a path through a process's links to anywhere"))
                continue
            reason = self._secret_place(text, pattern=word.pattern)
            if reason is not None:
                found.append(self._secret(reason))
        return found

    def _secret_place(self, text: str, *, pattern: bool) -> str | None:
        from mibyan.tools.path_policy import secret_pattern_reason, secret_reason

        for path in self.resolve(text):
            reason = secret_reason(path, cwd=self.cwds[0])
            if reason is None and pattern:  # `~/.ss?/id_*` is ~/.ssh/id_rsa when it runs
                reason = secret_pattern_reason(path)
            if reason is not None:
                return reason
        return None

    def _secret(self, reason: str) -> Verdict:
        # a gateway agent's user is not the person whose secrets these are: never
        tier: Tier = "hardline" if self.gateway else "dangerous"
        return Verdict(tier, f"reads or changes {reason}", "secret_file", ask_every_time=True)

    def _unknown(self, word: Word, text: str, *, opens: bool) -> list[Verdict]:
        """A word only known when it runs: judged by the values the command gives it, a process's
        files under /proc whatever the process, and (for a gateway agent) asked about."""
        if not opens:
            return []
        found = self.secrets([Word(guess) for guess in word.guesses[:16]])
        if _PROCESS_FILE.match(text):
            found.append(
                self._secret(f"{_shown(text)}, which may be the environment of a process (API keys)")
            )
        elif self._agent_folder is not None:
            reason = f"names a file only known when it runs ({_shown(text)}): a gateway agent's commands"
            # its value may be any part of the home: each use is a new question
            found.append(
                Verdict(
                    "dangerous",
                    f"{reason} must name their files plainly",
                    "dynamic_path",
                    ask_every_time=True,
                )
            )
        return found

    def _above_home(self, text: str) -> Verdict | None:
        """For a gateway agent whose commands see the home, a folder above it (`/`, `/tmp/*`): what
        reads all of it (`grep -r`, `find`, `tar`) would read the home, so it asks every time."""
        from mibyan.tools.path_policy import may_reach

        if self._agent_folder is None or self._home_hidden:
            return None
        homes = {Path(os.path.normpath(self.home)), Path(os.path.realpath(self.home))}
        for path in self.resolve(text):
            depth = len(path.parts)
            if any(depth < len(h.parts) and may_reach(path, Path(*h.parts[:depth])) for h in homes):
                reason = f"reads {_shown(str(path))}, which holds mibyan's home, and no sandbox hides it here"
                return Verdict("dangerous", reason, "above_home", ask_every_time=True)
        return None

    def _sealed(self, text: str, *, pattern: bool = False) -> str | None:
        """For a gateway agent, why a word naming a part of the home not its own is refused (a glob,
        when it may match one: `/tmp/*/.mibyan/state.db`)."""
        from mibyan.tools.path_policy import may_reach

        if self._agent_folder is None or not text:
            return None
        homes = {self.home, Path(os.path.realpath(self.home))}
        for path in self.resolve(text):
            sealed = self._own.sealed(path, cwd=Path.cwd())
            if sealed is not None:
                return sealed
            own = str(path).startswith(str(self._agent_folder) + "/")
            if pattern and not own and any(may_reach(path, home) for home in homes):
                return f"{path}, which may name a part of mibyan's home ({self.home}) not its own"
        return None

    def _judge_dynamic(self, words: list[Word], feed: Feed) -> Verdict:
        """A command whose name is only known at run time: its own kind, unless a guess is hardline."""
        head = words[0]
        guesses = list(head.guesses) or _pattern_guesses(head)
        # the script may give the name other values than those the judge saw: assume the worst as well
        for guess in [*guesses[:16], "rm", "dd"]:
            verdict = judge_invocation(self, [Word(guess), *words[1:]], feed)
            if verdict.tier == "hardline":
                return verdict
        shown = head.text if len(head.text) <= 40 else head.text[:40] + "…"
        return Verdict(
            "dangerous", f"runs a command whose name is only known when it runs ({shown})", "dynamic_command"
        )


def _resolve(text: str, cwds: list[Path]) -> tuple[Path, ...]:
    """The absolute paths a static path may mean, relative ones against each of `cwds`."""
    text = text.partition("\0")[0]  # an argument ends at a NUL byte (`$'/\0x'` is "/")
    text = _LEADING_SLASHES.sub("/", text)  # normpath keeps a leading "//", which is "/" on Linux
    if text.startswith("/"):
        return (Path(os.path.normpath(text)),)
    return tuple(Path(os.path.normpath(os.path.join(cwd, text))) for cwd in cwds)


def _pattern_guesses(word: Word) -> list[str]:
    """The commands the judge knows of that a glob used as a command name (`/bin/r?`) may run."""
    if not word.pattern:
        return []
    pattern = command_name(word)
    return sorted(name for name in KNOWN_NAMES if fnmatch.fnmatchcase(name, pattern))


def _process_home() -> Path:
    """`Path.home()`, made as one Path rather than two: it is asked for at every judgement."""
    home = os.path.expanduser("~")
    if home.startswith("~"):
        raise RuntimeError("Could not determine home directory.")
    return Path(home)


def judge(
    command: str,
    policy: JudgePolicy | None = None,
    *,
    cwd: Path,
    home: Path | None = None,
    user_home: Path | None = None,
) -> Verdict:
    """Judge a shell command line: "safe", "dangerous" (ask first) or "hardline" (never run).

    The verdict depends on the arguments alone: nothing ambient is read.

    Args:
        command: the command line, as bash will receive it.
        policy: what the command is judged for (the home, a gateway agent's folders, the sandbox).
        cwd: the directory the command runs in.
        home: instead of `policy`: the mibyan home of a user at their terminal.
        user_home: the user's home directory (`~`, `$HOME`); the process's own when omitted.
    """
    if policy is None:
        if home is None:
            raise TypeError("judge() needs a policy, or the home to judge for")
        policy = JudgePolicy(home=home)
    elif home is not None and home != policy.home:
        raise TypeError("judge() takes the home in its policy; the two differ")
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND_BYTES:
        return Verdict(
            "hardline",
            f"is {size:,} bytes long; mibyan judges commands of up to {MAX_COMMAND_BYTES:,} bytes: "
            "write it to a script file and run that",
            "too_long",
        )
    judge = CommandJudge(policy=policy, cwd=cwd, user_home=user_home or _process_home())
    judge.budget += len(command)
    try:
        return judge.script(command)
    except (_TooComplex, RecursionError):  # nesting deeper than Python's stack counts as too complex
        return _TOO_COMPLEX
