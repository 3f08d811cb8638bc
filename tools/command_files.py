"""Scripts on disk that a command runs: read when the command is judged, and judged by what they hold.

`bash build.sh`, `source env.sh`, `./run`, `python3 tool.py`, `perl x.pl`: what runs is the file's text,
so the judge reads it (from the directory the command will run in) and judges it as the command would
run it: a shell script with the same judge, code of another language with the inline-code patterns
(tools/command_code.py, with the project's own modules it imports: tools/command_imports.py), a `#!`
line by the interpreter it names. A program file that is a binary, or that root installed, is judged by
its name, as any program is. A script that cannot be read (missing, not a regular file, too large, not
text, a binary handed to an interpreter) asks, and so does one that sits somewhere secret.

What is judged is the file as it is at that moment. The terminal judges the command again just before
it starts, so a script changed while the user was asked does not run; a change the command itself makes
in a way the judge does not follow (an archive it unpacks), or one made after it started (a script run
later in the background), is not seen: the sandbox still confines what runs.
"""

from __future__ import annotations

import functools
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mibyan.tools.command_words import Judge, Word, combine
from mibyan.tools.verdict import SAFE, Verdict

MAX_BYTES = 256 * 1024  # one script; a larger one is not read, and asks
TOTAL_BYTES = 2 * MAX_BYTES  # all the scripts one command runs

#: Judges a script's text: its verdict, and the line (from 1) that carries it when that is known.
Reader = Callable[[str], tuple[Verdict, "int | None"]]


@dataclass(frozen=True)
class Contents:
    """A file as the judge read it: its text, or that it is a binary, or why it could not be read."""

    text: str | None = None
    binary: bool = False
    problem: str = ""


def _descriptor(path: Path) -> bool:
    """Whether `path` leads through /proc or /dev (`/dev/fd/5`, a link to `/proc/self/fd/5`): there the
    judge would read its own open files, not those of the command, which has others."""
    text = os.path.abspath(path)
    for _ in range(40):
        text = os.path.join(os.path.realpath(os.path.dirname(text)), os.path.basename(text))
        if text.startswith(("/proc/", "/dev/")):
            return True
        try:
            target = os.readlink(text)
        except OSError:
            return False  # not a link: the file itself
        text = os.path.normpath(os.path.join(os.path.dirname(text), target))
    return True


def read_file(path: Path, room: int = MAX_BYTES) -> Contents:
    """Read a script without ever blocking: only a regular file is opened, and only its first bytes."""
    if room <= 0:
        return Contents(problem="this command runs more scripts than mibyan reads for one command")
    try:
        if _descriptor(path):
            return Contents(problem="it is a device or a process's open file")
        if not stat.S_ISREG(os.stat(path).st_mode):
            return Contents(problem="it is not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return Contents(problem="there is no such file")
    except OSError as error:
        return Contents(problem=f"it cannot be opened ({error.strerror or 'error'})")
    except ValueError:  # a NUL byte in the name
        return Contents(problem="its name cannot be a file's")
    try:
        info = os.fstat(fd)  # the same file that was opened, whatever the name points to now
        if not stat.S_ISREG(info.st_mode):
            return Contents(problem="it is not a regular file")
        limit = min(MAX_BYTES, room)
        data = os.read(fd, 4096)  # a binary is known by its first bytes: no need to read on
        if data.startswith(b"\x7fELF") or b"\0" in data:
            return Contents(binary=True, problem="it is a binary, not a script")
        while data and len(data) <= limit:
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as error:
        return Contents(problem=f"it cannot be read ({error.strerror or 'error'})")
    finally:
        os.close(fd)
    if len(data) > limit:
        return Contents(problem=f"it is larger than mibyan reads ({limit // 1024} KiB)")
    if b"\0" in data:
        return Contents(binary=True, problem="it is a binary, not a script")
    try:
        return Contents(text=data.decode("utf-8"))
    except UnicodeDecodeError:
        return Contents(problem="it is not UTF-8 text")


def _shown(text: str) -> str:
    return text if len(text) <= 60 else text[:60] + "…"


def _unreadable(what: str, problem: str) -> Verdict:
    return Verdict("dangerous", f"runs {what}, which mibyan cannot read: {problem}", "unreadable_script")


def _candidates(j: Judge, word: Word, *, search: str) -> list[Path]:
    """The files `word` may name. `search`: "" (relative to the working directory), "after" (bash
    FILE: then the PATH), "first" (source FILE: the PATH first)."""
    local = j.resolve(word.text)
    if search == "" or "/" in word.text:
        return local
    found = [p for p in local if p.exists()]
    on_path = [Path(d) / word.text for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    on_path = [p for p in on_path if p.is_file()][:1]
    if search == "first":
        return on_path or local
    return found or on_path or local


def judge_script_file(
    j: Judge, word: Word, reader: Reader, *, what: str, search: str = "", again: Verdict | None = None
) -> Verdict:
    """Judge a script file an interpreter runs (`bash FILE`, `python3 FILE`) by its text.

    `again`: the verdict when the file is already being judged (by default, it runs itself: ask).
    """
    if j.cwd_unknown and not os.path.isabs(word.text):
        return _unreadable(what, "it is in a folder only known when it runs")
    paths = _candidates(j, word, search=search)
    existing = [p for p in paths if os.path.lexists(p)]
    if not existing:
        return _unreadable(what, "there is no such file")
    return combine(_judge_one(j, path, reader, what, again) for path in existing)


def _judge_one(j: Judge, path: Path, reader: Reader, what: str, again: Verdict | None) -> Verdict:
    refused = combine(j.secrets([Word(str(path))]))  # a link to a key is the key: never read it out
    if refused.tier != "safe":
        return refused
    contents = j.read_script(path)
    if contents.text is None:
        return _unreadable(what, contents.problem)
    key = ("text", Path(os.path.realpath(path)))
    if not j.enter_script(key):
        return again or Verdict("dangerous", f"runs {what}, which runs itself again", "unreadable_script")
    try:
        verdict, line = reader(contents.text)
    finally:
        j.leave_script(key)
    if verdict.tier == "safe":
        return SAFE
    lines = contents.text.splitlines()
    if line is not None and 0 < line <= len(lines):
        reason = f"runs {what}, whose line {line} ({_shown(lines[line - 1].strip())}) {verdict.reason}"
    else:
        reason = f"runs {what}, which {verdict.reason}"
    return Verdict(verdict.tier, reason, verdict.key, ask_every_time=verdict.ask_every_time)


def judge_program_file(j: Judge, words: Sequence[Word], as_shell: Reader) -> Verdict:
    """`./run ARGS`, `/opt/x/bin/tool`: a binary is judged by its name (elsewhere); a script by its `#!`
    line's interpreter, or as a shell script when it has none (bash runs it so)."""
    word = words[0]
    what = f"the program {_shown(word.text)}"
    if j.cwd_unknown and not os.path.isabs(word.text):
        return _unreadable(what, "it is in a folder only known when it runs")
    existing = [p for p in j.resolve(word.text) if os.path.lexists(p)]
    if not existing:
        return _unreadable(what, "there is no such file")
    findings: list[Verdict] = []
    for path in existing:
        refused = combine(j.secrets([Word(str(path))]))
        if refused.tier != "safe":
            findings.append(refused)
            continue
        if _installed(path):
            continue  # `/usr/bin/zgrep` is judged as `zgrep` is: by its name
        contents = j.read_script(path)
        if contents.binary:
            continue  # judged by its name, as every program is
        if contents.text is None:
            findings.append(_unreadable(what, contents.problem))
        elif contents.text.startswith("#!"):
            findings.append(_interpreted(j, path, contents.text, words))
        else:
            findings.append(judge_script_file(j, Word(str(path)), as_shell, what=f"the script {word.text}"))
    return combine(findings)


def _installed(path: Path) -> bool:
    """Whether `path` is a program installed by someone else, root: a file neither mibyan's user nor
    the commands it runs could have written (when mibyan runs as root, every file could be)."""
    try:
        owner = os.stat(path).st_uid
    except (OSError, ValueError):
        return False
    if owner != 0 or os.getuid() == 0:
        return False
    real = os.path.realpath(path)
    return not os.access(real, os.W_OK) and not os.access(os.path.dirname(real), os.W_OK)


def _interpreted(j: Judge, path: Path, text: str, words: Sequence[Word]) -> Verdict:
    """A script with a `#!` line: the kernel runs `INTERPRETER [ARG] FILE ARGS...`."""
    first = text[2:].partition("\n")[0].strip()
    interpreter, _, argument = first.partition(" ")
    if not interpreter:
        return _unreadable(f"the script {_shown(words[0].text)}", "its #! line names no interpreter")
    key = ("program", Path(os.path.realpath(path)))
    if not j.enter_script(key):
        return Verdict(
            "dangerous", f"runs the script {words[0].text}, which runs itself", "unreadable_script"
        )
    try:
        line = [Word(interpreter), *([Word(argument.strip())] if argument.strip() else [])]
        return j.run([*line, words[0], *words[1:]])
    finally:
        j.leave_script(key)


def found_on_path(j: Judge, name: str) -> Path | None:
    """The file a command name runs when bash finds it first in a folder of the PATH that the model's
    commands may write (inside the working directory or the temporary directory: `.venv/bin`, `.`);
    None for the programs installed elsewhere, which are judged by their names."""
    entries = os.environ.get("PATH", "")
    for index, folder in _writable_path(entries, j.cwd):
        candidate = folder / name
        if os.path.isfile(candidate):
            earlier = (Path(e) / name for e in entries.split(os.pathsep)[:index] if os.path.isabs(e))
            return None if any(os.path.isfile(p) for p in earlier) else candidate
    return None


@functools.lru_cache(maxsize=16)
def _writable_path(entries: str, where: Path) -> tuple[tuple[int, Path], ...]:
    """The PATH entries (with their places in it) that lie where the model's commands may write."""
    cwd = str(where)
    free = [cwd, str(Path(tempfile.gettempdir()).resolve()), "/tmp"]
    folders: list[tuple[int, Path]] = []
    for index, entry in enumerate(entries.split(os.pathsep)):
        folder = os.path.normpath(os.path.join(cwd, entry)) if entry else cwd  # "" and "." are the cwd
        if any(folder == f or folder.startswith(f.rstrip("/") + "/") for f in free):
            folders.append((index, Path(folder)))
    return tuple(folders)


def script_file(
    j: Judge, name: str, word: Word, reader: Reader, *, search: str = "", again: Verdict | None = None
) -> Verdict:
    """Running a script file: judged by what this very command wrote to it, or else by what it holds on
    disk; a file only known when it runs asks."""
    if word.dynamic:
        return Verdict(
            "dangerous",
            f"runs a script that is only known when it runs ({name} {word.text})",
            "pipe_to_shell",
        )
    content = j.written(word)
    if isinstance(content, str):
        return reader(content)[0]
    if content is not None:
        return Verdict("dangerous", f"runs a script it has just written ({word.text})", "pipe_to_shell")
    if not word.text:
        return SAFE  # `BASH_ENV=`: no file
    return judge_script_file(j, word, reader, what=f"the script {word.text}", search=search, again=again)
