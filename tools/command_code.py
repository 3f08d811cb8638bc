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

from mibyan.tools.command_files import Reader, script_file
from mibyan.tools.command_imports import imports, local_module
from mibyan.tools.command_mibyan import is_mibyan_module, judge_mibyan
from mibyan.tools.command_paths import is_broad
from mibyan.tools.command_words import Feed, Judge, Stream, Word, combine
from mibyan.tools.verdict import SAFE, Verdict

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
        "rscript",
    ]
)
_INTERPRETER = re.compile(
    r"^(python[0-9.]*|pypy[0-9.]*|perl[0-9.]*|ruby[0-9.]*|node(js)?|bun|php[0-9.]*|lua[0-9.]*|rscript)$"
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
    "r": ("e", "", ()),
}
# per language: the letter and the long options that run a file before the script
_PRELOADS: dict[str, tuple[str, tuple[str, ...]]] = {
    "node": ("r", ("--require", "--import", "--loader", "--experimental-loader")),
    "ruby": ("r", ()),
}
_EXEC = {
    # a bare call (`system(...)` after `from os import system`), not a method (`re.compile`, `cur.execute`)
    "python": r"\bos\.(system|popen|exec|spawn|posix_spawn)|subprocess|\bpty\b|__import__|importlib|ctypes|"
    r"getattr\s*\(|(?<![\w.])(eval|exec|exec[lv]\w*|compile|system|popen|spawn\w*)\s*\(|from\s+os\s+import",
    "perl": r"\bsystem\b|\bexec\b|`|\bqx\b|\bopen\s*\(?[^;]*\||\beval\b",
    "ruby": r"\bsystem\b|\bexec\b|`|%x|IO\.popen|Open3|\bspawn\b|\beval\b|instance_eval|\bsend\s*\(",
    "node": r"child_process|execSync|spawnSync|(?<![\w.])(exec|spawn|eval)\s*\(|execFile|Function\s*\(|"
    r"\bvm\b|process\.binding|require\s*\(\s*[^'\"]|\bimport\s*\(",
    "php": r"\bsystem\s*\(|shell_exec|passthru|\bexec\s*\(|proc_open|popen|`|\beval\s*\(|assert\s*\(",
    "lua": r"os\.execute|io\.popen|loadstring|\bload\s*\(",
    "awk": r"\bsystem\s*\(|\|\s*getline|\|&|print[^;}]*\|",
    "r": r"\bsystem2?\s*\(|\bshell\s*\(|\bpipe\s*\(|\beval\s*\(|\bparse\s*\(|do\.call|processx|\bsource\s*\(",
}
_DELETE_TREE = re.compile(
    r"unlink\s*\([^)]*recursive|rmtree|rm_rf|rm_r\b|remove_tree|rimraf|rmSync|\bfs\.rm\b|rmdirSync|FileUtils\.rm"
)
_DELETE = re.compile(r"\bunlink|\bremove\s*\(|os\.remove|\brmdir|File\.delete|removedirs")
_WRITE = re.compile(
    r"open\s*\(|write_text|write_bytes|writeFile|appendFile|File\.write|shutil\.(copy|move)|"
    r"os\.(rename|replace|chmod|symlink|link)|writeLines|file\.(create|copy)|fopen|file_put_contents|copyFile|rename|symlink|chmod|>>?\s*\"|"
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


def _stdin_code(j: Judge, name: str, feed: Feed, reader: Reader) -> Verdict:
    def judge_text(text: str) -> Verdict:
        return reader(text)[0]

    if isinstance(feed, str):
        return judge_text(feed)
    if isinstance(feed, Stream) and feed.source == "<":  # `bash < FILE`
        return script_file(j, name, Word(feed.path or "<file>", dynamic=not feed.path), reader)
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


def code_reader(j: Judge, language: str) -> Reader:
    return lambda text: code_at(j, language, text)


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
        return script_file(j, name, rest[0], j.script_at, search="after" if name == "bash" else "")
    return _stdin_code(j, name, feed, j.script_at)


def judge_interpreter(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    """`python -c CODE`, `perl -e CODE`, `node -e CODE`, `python3 - <<EOF`, `perl -pi -e ... FILE`."""
    language = _language(name)
    code_letters, valued, long_code = _OPTIONS[language]
    codes: list[Word] = []
    preloads: list[Word] = []  # `node -r ./x.js`, `ruby -r ./x.rb`: files run before the script
    preload_letter, preload_long = _PRELOADS.get(language, ("", ()))
    in_place = False
    i = 0
    while i < len(args) and args[i].text.startswith("-") and args[i].text not in ("-", "--"):
        text = args[i].text
        if text.startswith("--"):
            option, eq, value = text.partition("=")
            if option in long_code or option in preload_long:
                given = Word(value, args[i].dynamic) if eq else args[i + 1] if i + 1 < len(args) else None
                i += 0 if eq else 1
                if given is not None:
                    (codes if option in long_code else preloads).append(given)
            i += 1
            continue
        for position, letter in enumerate(text[1:], start=1):
            if language == "python" and letter == "m":
                module = text[position + 1 :] or (args[i + 1].text if i + 1 < len(args) else "")
                if is_mibyan_module(module):
                    return judge_mibyan(args[i + 1 :] if text[position + 1 :] else args[i + 2 :])
                return local_module(j, name, module, lambda other: code_reader(j, other))
            in_place |= letter == "i" and language in ("perl", "ruby")
            if letter in code_letters or letter in valued:
                attached = text[position + 1 :]
                given = Word(attached, args[i].dynamic) if attached else None
                if given is None and i + 1 < len(args):
                    given = args[i + 1]
                    i += 1
                if letter in code_letters and given is not None:
                    codes.append(given)
                if letter == preload_letter and given is not None:
                    preloads.append(given)
                break
        i += 1
    if i < len(args) and args[i].text == "--":
        i += 1
    rest = args[i:]
    findings = [j.write(w, "edits") for w in (rest if codes else rest[1:]) if in_place]
    findings += [
        script_file(j, name, w, code_reader(j, language))
        for w in preloads
        if w.dynamic or w.text.startswith(("./", "../", "/"))  # else an installed package
    ]
    for code in codes:
        findings.append(_code_word(code, lambda text: _inline_code(j, language, text), f"{language} code"))
    if not codes:
        if rest and rest[0].text not in _STDIN_FILES:
            findings.append(script_file(j, name, rest[0], code_reader(j, language)))
        else:
            findings.append(_stdin_code(j, name, feed, code_reader(j, language)))
    return combine(findings)


def judge_awk(j: Judge, args: list[Word]) -> Verdict:
    i = 0
    while i < len(args) and args[i].text.startswith("-") and args[i].text != "--":
        text = args[i].text
        if text in ("-f", "--file"):  # the program is in a file
            return script_file(j, "awk", args[i + 1], code_reader(j, "awk")) if i + 1 < len(args) else SAFE
        if text in ("-e", "--source") and i + 1 < len(args):
            return _code_word(args[i + 1], lambda code: judge_code(j, "awk", code), "awk code")
        i += 2 if text in ("-F", "-v", "--assign", "--field-separator") else 1
    if i < len(args) and args[i].text == "--":
        i += 1
    if i >= len(args):
        return SAFE
    return _code_word(args[i], lambda code: judge_code(j, "awk", code), "awk code")


#: Code that turns text into names or code (`getattr(shutil, "rmtree")`, `eval("...")`, decoding): what
#: its strings say may be what it does.
_TEXT_TO_CODE = re.compile(
    r"getattr|__import__|importlib|\beval\b|\bexec\b|\bcompile\b|globals|locals|\bvars\b|__dict__|"
    r"__builtins__|decode|fromhex|b64|base64|codecs|\bchr\b|\bpack\b|\bsend\b|\bFunction\b|\bload"
)


_TELLS = re.compile(r"[(;]")  # a string that may hold code calls or sequences something
#: Quoted strings only: backticks run a command in perl, ruby and php (`` `rm -rf /` ``).
_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")


def _acting(code: str) -> str:
    """The code with what its string literals say blanked (`print("shutil.rmtree")` deletes nothing),
    unless it turns text into names or code, when the strings may be what it does. The literals
    themselves are still judged as commands it may run and files it may write."""
    bare = _QUOTED.sub(lambda m: '""' + "\n" * m.group(0).count("\n"), code)  # lines stay where they are
    return code if _TEXT_TO_CODE.search(bare) else bare


def _literals(code: str) -> list[str]:
    return [re.sub(r"\\(.)", r"\1", "".join(groups)) for groups in _LITERAL.findall(code)]


def judge_code(j: Judge, language: str, code: str, *, whole_file: bool = False) -> Verdict:
    """Judge code of another language by what it visibly does.

    `whole_file`: `code` is a script file rather than a one-liner, so what makes it hardline (a broad
    folder deleted, mibyan's files written) must be seen on the line that deletes, or in a string that
    names mibyan's files; a file that only mentions mibyan somewhere asks.
    """
    literals = _literals(code)
    shown = f"inline {language} code" if not whole_file else f"{language} code"
    original, code = code, _acting(code)
    if re.search(r"\bfork\b", code) and re.search(r"\b(while|for|loop|until|do)\b", code):
        return Verdict("hardline", f"is a fork bomb, which freezes the machine ({shown})", "fork_bomb")
    findings: list[Verdict] = []
    if re.search(_EXEC[language], code):
        commands = [j.script(text) for text in literals if text.strip()]
        commands.append(j.script(" ".join(literals)))
        if code is original:  # `exec("shutil.rmtree('/')")`: a string may be code of the language itself
            inner = (judge_code(j, language, text) for text in literals if _TELLS.search(text))
            commands += [v for v in inner if v.tier == "hardline"]
        findings += [Verdict("dangerous", f"starts other programs from {shown}", "inline_code"), *commands]
    if _DELETE_TREE.search(code):
        lines = zip(original.splitlines(), code.splitlines(), strict=False)
        where = [line for line, seen in lines if _DELETE_TREE.search(seen)] if whole_file else [original]
        if any(_deletes_broadly(j, part) for part in where):
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
        if re.search(r"mibyan", original, re.IGNORECASE):  # a path into mibyan's files, however it is built
            if not whole_file or any(_MIBYAN_PATH.search(text) for text in literals):
                return Verdict("hardline", f"writes to mibyan's own files from {shown}", "protected")
            findings.append(Verdict("dangerous", f"writes files and names mibyan in {shown}", "inline_code"))
        findings += [
            j.write(Word(_home(j, text)), "writes to") for text in literals if text and "\n" not in text
        ]
        findings = [f for f in findings if f.key != "dynamic_write"]
    return combine(findings)


_MIBYAN_PATH = re.compile(r"(^|[/.])mibyan|mibyan_home", re.IGNORECASE)
_TELLING = [_DELETE_TREE, _DELETE, _WRITE, re.compile(r"\bfork\b")]


def _deletes_broadly(j: Judge, code: str) -> bool:
    """Whether code that deletes trees names the root, a home or a system folder."""
    quoted = re.findall(r"['\"`]([/~][^'\"`]*)['\"`]", code)  # also inside nested quotes
    return _HOME_MARKERS.search(code) is not None or any(
        is_broad(path, j.user_home)
        for text in [*_literals(code), *quoted]
        if text.startswith(("/", "~"))
        for path in j.resolve(_home(j, text))
    )


def _inline_code(j: Judge, language: str, code: str) -> Verdict:
    """`python3 -c CODE`: the code, and the project's own modules it imports."""
    imported = imports(j, language, code, lambda other: code_reader(j, other))
    return combine([judge_code(j, language, code), *(verdict for _, verdict in imported)])


def code_at(j: Judge, language: str, code: str) -> tuple[Verdict, int | None]:
    """Judge a script file of another language; the line (from 1) that shows why, when one does.

    A Python script's imports of the project's own modules (found beside it, in the working
    directory) are judged with it: they run as soon as it starts.
    """
    verdict = judge_code(j, language, code, whole_file=True)
    imported = imports(j, language, code, lambda other: code_reader(j, other))
    worst = combine([verdict, *(found for _, found in imported)])
    if worst.tier == "safe":
        return worst, None
    for number, module in imported:
        if module.tier == worst.tier and verdict.tier != worst.tier:
            return worst, number
    telling = [re.compile(_EXEC[language]), *_TELLING]
    fallback = None
    for number, line in enumerate(code.splitlines(), start=1):
        if not any(pattern.search(line) for pattern in telling):
            continue
        tier = judge_code(j, language, line, whole_file=True).tier
        if tier == worst.tier:
            return worst, number
        if fallback is None and tier != "safe":
            fallback = number
    return worst, fallback


def _home(j: Judge, text: str) -> str:
    if text == "~" or text.startswith("~/"):
        return str(j.user_home) + text[1:]
    return text
