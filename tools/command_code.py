"""The code a command runs: shells (`sh -c`, a script on stdin) and interpreters (`python -c`, `perl -e`).

Shell code is parsed in turn by the command judge. Code in other languages cannot be read as a shell
would, so it is searched for what matters: starting programs (`os.system`, `system(...)`, backticks),
deleting trees (`shutil.rmtree`), deleting or writing files, and forking in a loop. The string literals
of code that starts programs are judged as shell commands (one by one, and joined for argv lists), so
`python3 -c 'import os; os.system("rm -rf /")'` is as hardline as `rm -rf /`; starting programs at all is
"ask", since the judge cannot follow what the code computes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from mibyan.tools.approval import SAFE, Verdict
from mibyan.tools.command_mibyan import is_mibyan_module, judge_mibyan
from mibyan.tools.command_paths import is_broad
from mibyan.tools.command_words import Feed, Judge, Stream, Word, combine

SHELLS = frozenset(
    ["sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "rbash", "yash", "posh"]
)
INTERPRETERS = frozenset(
    [
        "python",
        "python2",
        "python3",
        "pypy",
        "pypy3",
        "perl",
        "ruby",
        "node",
        "nodejs",
        "bun",
        "php",
        "lua",
        "luajit",
    ]
)
_INTERPRETER = re.compile(
    r"^(python[0-9.]*|pypy[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node(js)?|bun|php[0-9.]*|lua[0-9.]*)$"
)
_STDIN_FILES = {"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"}
_NETWORK = {"curl", "wget", "fetch", "http", "https", "aria2c", "nc", "ncat", "socat", "lynx", "ftp", "ssh"}

# per language: (letters that introduce inline code, letters that take a value, long code options)
_OPTIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "python": ("c", "WXQ", ()),
    "perl": ("eE", "IMmdDx", ()),
    "ruby": ("e", "IrEC", ()),
    "node": ("ep", "r", ("--eval", "--print")),
    "php": ("r", "cdz", ()),
    "lua": ("e", "l", ()),
}
_EXEC = {
    # a bare call (`system(...)` after `from os import system`), not a method (`re.compile`, `cur.execute`)
    "python": r"\bos\.(system|popen|exec|spawn|posix_spawn)|subprocess|\bpty\b|__import__|importlib|ctypes|"
    r"getattr\s*\(|(?<![\w.])(eval|exec\w*|compile|system|popen|spawn\w*)\s*\(|from\s+os\s+import",
    "perl": r"\bsystem\b|\bexec\b|`|\bqx\b|\bopen\s*\(?[^;]*\||\beval\b",
    "ruby": r"\bsystem\b|\bexec\b|`|%x|IO\.popen|Open3|\bspawn\b|\beval\b|instance_eval|\bsend\s*\(",
    "node": r"child_process|execSync|spawnSync|(?<![\w.])(exec|spawn|eval)\s*\(|execFile|Function\s*\(|"
    r"\bvm\b|process\.binding|require\s*\(\s*[^'\"]|\bimport\s*\(",
    "php": r"\bsystem\s*\(|shell_exec|passthru|\bexec\s*\(|proc_open|popen|`|\beval\s*\(|assert\s*\(",
    "lua": r"os\.execute|io\.popen|loadstring|\bload\s*\(",
    "awk": r"\bsystem\s*\(|\|\s*getline|\|&|print[^;}]*\|",
}
_DELETE_TREE = re.compile(r"rmtree|rm_rf|rm_r\b|remove_tree|rimraf|rmSync|\bfs\.rm\b|rmdirSync|FileUtils\.rm")
_DELETE = re.compile(r"\bunlink|\bremove\s*\(|os\.remove|\brmdir|File\.delete|removedirs")
_WRITE = re.compile(
    r"open\s*\(|write_text|write_bytes|writeFile|appendFile|File\.write|shutil\.(copy|move)|"
    r"os\.(rename|replace|chmod|symlink|link)|fopen|file_put_contents|copyFile|rename|symlink|chmod|>>?\s*\"|"
    r"connect\s*\(|sqlite"
)
_HOME_MARKERS = re.compile(
    r"Path\.home|expanduser|environ\s*\[\s*['\"]HOME|ENV\s*[\[{]\s*['\"]?HOME|homedir|getenv"
)
_LITERAL = re.compile(r"'((?:[^'\\\n]|\\.)*)'|\"((?:[^\"\\\n]|\\.)*)\"|`([^`]*)`")


def is_interpreter(name: str) -> bool:
    return _INTERPRETER.match(name) is not None


def _language(name: str) -> str:
    for language in _OPTIONS:
        if name.startswith(language) or (language == "python" and name.startswith("pypy")):
            return language
    return "node" if name in ("nodejs", "bun") else "lua"


def _stdin_code(name: str, feed: Feed, judge_text: Callable[[str], Verdict]) -> Verdict:
    if isinstance(feed, str):
        return judge_text(feed)
    if isinstance(feed, Stream):
        for guess in feed.guesses:
            verdict = judge_text(guess)
            if verdict.tier == "hardline":
                return verdict
        if feed.source in _NETWORK:
            reason = f"runs a script downloaded from the network ({feed.source} | {name})"
        else:
            reason = f"runs a script that another command writes ({name} reads it from a pipe)"
        return Verdict("dangerous", reason, "pipe_to_shell")
    return SAFE


def _code_word(word: Word, judge_text: Callable[[str], Verdict], what: str) -> Verdict:
    if not word.dynamic:
        return judge_text(word.text)
    for guess in word.guesses:
        verdict = judge_text(guess)
        if verdict.tier == "hardline":
            return verdict
    return Verdict("dangerous", f"runs {what} that is only known when it runs", "dynamic_command")


def script_file(j: Judge, name: str, word: Word, judge_text: Callable[[str], Verdict]) -> Verdict:
    """Running a script file: judged when this very command wrote it, asked when it is only known later."""
    if word.dynamic:
        return Verdict(
            "dangerous",
            f"runs a script that is only known when it runs ({name} {word.text})",
            "pipe_to_shell",
        )
    content = j.written(word)
    if isinstance(content, str):
        return judge_text(content)
    if content is not None:
        return Verdict("dangerous", f"runs a script it has just written ({word.text})", "pipe_to_shell")
    return SAFE


def judge_shell(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    """`sh -c CODE`, `bash -lc CODE`, `bash <<EOF`, `echo ... | sh`, `bash script`."""
    i, command_mode, reads_stdin = 0, False, False
    while i < len(args):
        text = args[i].text
        if text == "--":
            i += 1
            break
        if text in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
        elif text.startswith("--"):
            i += 1
        elif text[:1] in ("-", "+") and len(text) > 1:
            command_mode |= "c" in text
            reads_stdin |= "s" in text
            i += 1
        else:
            break
    rest = args[i:]
    if command_mode:
        return (
            _code_word(rest[0], lambda code: j.script(code, feed), f"shell code ({name} -c)")
            if rest
            else SAFE
        )
    if rest and not reads_stdin and rest[0].text not in _STDIN_FILES:
        return script_file(j, name, rest[0], j.script)
    return _stdin_code(name, feed, j.script)


def judge_interpreter(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    """`python -c CODE`, `perl -e CODE`, `node -e CODE`, `python3 - <<EOF`, `perl -pi -e ... FILE`."""
    language = _language(name)
    code_letters, valued, long_code = _OPTIONS[language]
    codes: list[Word] = []
    in_place = False
    i = 0
    while i < len(args) and args[i].text.startswith("-") and args[i].text not in ("-", "--"):
        text = args[i].text
        if text.startswith("--"):
            option, eq, value = text.partition("=")
            if option in long_code:
                if eq:
                    codes.append(Word(value, args[i].dynamic))
                elif i + 1 < len(args):
                    codes.append(args[i + 1])
                    i += 1
            i += 1
            continue
        for position, letter in enumerate(text[1:], start=1):
            if language == "python" and letter == "m":
                module = text[position + 1 :] or (args[i + 1].text if i + 1 < len(args) else "")
                if is_mibyan_module(module):
                    return judge_mibyan(args[i + 1 :] if text[position + 1 :] else args[i + 2 :])
                return SAFE  # runs an installed module
            in_place |= letter == "i" and language in ("perl", "ruby")
            if letter in code_letters or letter in valued:
                attached = text[position + 1 :]
                given = Word(attached, args[i].dynamic) if attached else None
                if given is None and i + 1 < len(args):
                    given = args[i + 1]
                    i += 1
                if letter in code_letters and given is not None:
                    codes.append(given)
                break
        i += 1
    if i < len(args) and args[i].text == "--":
        i += 1
    rest = args[i:]
    findings = [j.write(w, "edits") for w in (rest if codes else rest[1:]) if in_place]
    for code in codes:
        findings.append(_code_word(code, lambda text: judge_code(j, language, text), f"{language} code"))
    if not codes:
        if rest and rest[0].text not in _STDIN_FILES:
            findings.append(script_file(j, name, rest[0], lambda text: judge_code(j, language, text)))
        else:
            findings.append(_stdin_code(name, feed, lambda text: judge_code(j, language, text)))
    return combine(findings)


def judge_awk(j: Judge, args: list[Word]) -> Verdict:
    i = 0
    while i < len(args) and args[i].text.startswith("-") and args[i].text != "--":
        text = args[i].text
        if text in ("-f", "--file"):
            return SAFE  # the program is in a file
        if text in ("-e", "--source") and i + 1 < len(args):
            return _code_word(args[i + 1], lambda code: judge_code(j, "awk", code), "awk code")
        i += 2 if text in ("-F", "-v", "--assign", "--field-separator") else 1
    if i < len(args) and args[i].text == "--":
        i += 1
    if i >= len(args):
        return SAFE
    return _code_word(args[i], lambda code: judge_code(j, "awk", code), "awk code")


def _literals(code: str) -> list[str]:
    return [re.sub(r"\\(.)", r"\1", "".join(groups)) for groups in _LITERAL.findall(code)]


def judge_code(j: Judge, language: str, code: str) -> Verdict:
    """Judge inline code of another language by what it visibly does."""
    literals = _literals(code)
    shown = f"inline {language} code"
    if re.search(r"\bfork\b", code) and re.search(r"\b(while|for|loop|until|do)\b", code):
        return Verdict("hardline", f"is a fork bomb, which freezes the machine ({shown})", "fork_bomb")
    findings: list[Verdict] = []
    if re.search(_EXEC[language], code):
        commands = [j.script(text) for text in literals if text.strip()]
        commands.append(j.script(" ".join(literals)))
        findings += [Verdict("dangerous", f"starts other programs from {shown}", "inline_code"), *commands]
    if _DELETE_TREE.search(code):
        quoted = re.findall(r"['\"`]([/~][^'\"`]*)['\"`]", code)  # also inside nested quotes
        broad = _HOME_MARKERS.search(code) is not None or any(
            is_broad(path, j.user_home)
            for text in [*literals, *quoted]
            if text.startswith(("/", "~"))
            for path in j.resolve(_home(j, text))
        )
        if broad:
            return Verdict(
                "hardline",
                f"deletes the root, your home or a system folder and all in it ({shown})",
                "rm_root",
            )
        findings.append(
            Verdict("dangerous", f"deletes a folder and everything in it ({shown})", "rm_recursive")
        )
    if _DELETE.search(code):
        findings.append(Verdict("dangerous", f"deletes files from {shown}", "inline_code"))
    if findings or _WRITE.search(code):
        if re.search(r"mibyan", code, re.IGNORECASE):  # a path into mibyan's files, however it is built
            return Verdict("hardline", f"writes to mibyan's own files from {shown}", "protected")
        findings += [
            j.write(Word(_home(j, text)), "writes to") for text in literals if text and "\n" not in text
        ]
        findings = [f for f in findings if f.key != "dynamic_write"]
    return combine(findings)


def _home(j: Judge, text: str) -> str:
    if text == "~" or text.startswith("~/"):
        return str(j.user_home) + text[1:]
    return text
