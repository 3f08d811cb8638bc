"""What each command does that may need the user: the rules the command judge applies to one command.

A rule sees the command's words (see tools/command_words.py) and what it reads on standard input. Rules
for wrappers (`sudo`, `env`, `nice`, `timeout`, `busybox`, ...) find the command they run and judge that;
rules for shells and interpreters judge the code they run (tools/command_code.py); the others judge the
command's own effect, including every file it writes (tools/command_paths.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from mibyan.tools.approval import SAFE, Verdict
from mibyan.tools.command_code import (
    INTERPRETERS,
    SHELLS,
    is_interpreter,
    judge_awk,
    judge_interpreter,
    judge_shell,
    script_file,
)
from mibyan.tools.command_files import found_on_path, judge_program_file
from mibyan.tools.command_mibyan import judge_mibyan
from mibyan.tools.command_paths import broad_target
from mibyan.tools.command_system import SYSTEM_RULES, judge_disk
from mibyan.tools.command_targets import TARGET_RULES
from mibyan.tools.command_words import Feed, Judge, Word, combine, command_name, split_options

Rule = Callable[[Judge, str, list[Word], Feed], Verdict]

# wrapper name -> (options that take a value, positional words before the command it runs)
_WRAPPERS: dict[str, tuple[frozenset[str], int]] = {
    name: (frozenset(valued.split()), skip)
    for name, valued, skip in [
        ("sudo", "-u -g -C -h -p -r -t -U -D -R -T --user --group --host --prompt --role --chdir", 0),
        ("doas", "-u -C", 0),
        ("pkexec", "--user", 0),
        ("run0", "-u -D --user --unit --property --description --slice --chdir --setenv", 0),
        ("nice", "-n --adjustment", 0),
        ("ionice", "-c -n -p -P -u -t --class --classdata", 0),
        ("timeout", "-s -k --signal --kill-after", 1),
        ("nohup", "", 0),
        ("time", "-f -o --format --output", 0),
        ("exec", "-a", 0),
        ("builtin", "", 0),
        ("coproc", "", 0),
        ("stdbuf", "-i -o -e --input --output --error", 0),
        ("chronic", "", 0),
        ("unbuffer", "", 0),
        ("setsid", "", 0),
        ("caffeinate", "-w -t", 0),
        ("strace", "-o -e -p -s -u -a -b -E -I -O -P -S -X", 0),
        ("ltrace", "-o -e -p -s -u -a -n", 0),
        ("chroot", "--userspec --groups", 1),
        ("unshare", "", 0),
        ("nsenter", "-t -S -G --target", 0),
        ("systemd-run", "-p -u -E --unit --property --description --slice --setenv -M", 0),
        ("firejail", "", 0),
        ("busybox", "", 0),
        ("toybox", "", 0),
        ("flock", "-w -E --timeout --conflict-exit-code", 1),
        ("taskset", "", 1),
        ("valgrind", "", 0),
        ("catchsegv", "", 0),
        ("xvfb-run", "-n -s -e -f -p", 0),
    ]
}
_ELEVATING = {"sudo", "doas", "pkexec", "run0"}


def _sudo(name: str) -> Verdict:
    return Verdict("dangerous", f"runs a command as root ({name})", "sudo")


def _wrapper(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    valued, skip = _WRAPPERS[name]
    flags, _, start = split_options(args, valued=valued)
    texts = [w.text for w in args]
    for option in ("-c", "--command"):
        if name == "flock" and option in texts[:-1]:
            return j.script(texts[texts.index(option) + 1], feed)
    if name == "taskset" and "-p" in flags:
        return SAFE
    inner = j.run(args[start + skip :], feed)
    if name in _ELEVATING:
        return combine([_sudo(name), inner])
    return inner


def _env(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    from mibyan.tools.command_git import changes_git_guard

    i = 0
    changed: list[str] = []
    clears = False
    while i < len(args):
        text = args[i].text
        if text in ("-u", "-C", "--unset", "--chdir"):
            if text in ("-u", "--unset") and i + 1 < len(args):
                changed.append(args[i + 1].text)
            i += 2
        elif text in ("-S", "--split-string") or text.startswith(("-S", "--split-string=")):
            split = text.partition("=")[2] if "=" in text else text[2:]
            if not split and i + 1 < len(args):
                split, i = args[i + 1].text, i + 1
            # `env -S "rm -rf /"`: the string is split into words like a tiny shell
            return j.script(" ".join([split, *(w.text for w in args[i + 1 :])]), feed)
        elif text.startswith("-") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", text):
            clears |= text in ("-", "-i", "--ignore-environment")
            changed.append(text.partition("=")[0] if not text.startswith("-") else text.partition("=")[2])
            i += 1
        else:
            break
    return combine([changes_git_guard(changed, clears=clears), j.run(args[i:], feed)])


def _command(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    flags, _, start = split_options(args)
    if "-v" in flags or "-V" in flags:
        return SAFE  # only says where the command is
    return j.run(args[start:], feed)


def _watch(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    _, _, start = split_options(args, valued={"-n", "--interval", "-q", "--equexit"})
    return j.script(" ".join(w.text for w in args[start:]), feed)


def _eval(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    if not any(w.dynamic for w in args):
        return j.script(" ".join(w.text for w in args), feed)
    for guesses in _guess_lines(args):
        verdict = j.script(guesses, feed)
        if verdict.tier == "hardline":
            return verdict
    return Verdict("dangerous", "runs shell code that is only known when it runs (eval)", "dynamic_command")


def _guess_lines(args: Sequence[Word]) -> list[str]:
    lines = [""]
    for word in args:
        options = word.guesses if word.dynamic else (word.text,)
        lines = [f"{line} {option}".strip() for line in lines for option in options][:16]
    return lines


def _alias_or_trap(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    if name == "alias":
        return combine(j.script(w.text.partition("=")[2]) for w in args if "=" in w.text)
    code = [w for w in args if not w.text.startswith("-")]
    return j.script(code[0].text) if code else SAFE


def _editor(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    """`vim -c '!rm -rf /'`, `vim +'!cmd'`: an ex command starting with `!` runs a shell command."""
    commands = [
        args[i + 1].text for i, w in enumerate(args[:-1]) if re.fullmatch(r"-[a-zA-Z]*c|--cmd", w.text)
    ]
    commands += [w.text[1:] for w in args if w.text.startswith("+")]
    shell = [c.lstrip(": ")[1:] for c in commands if c.lstrip(": ").startswith("!")]
    return combine(j.script(code) for code in shell)


def _script(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    """util-linux `script -c CMD`: runs CMD in a shell."""
    texts = [w.text for w in args]
    codes = [texts[i + 1] for i, t in enumerate(texts[:-1]) if re.fullmatch(r"-[a-zA-Z]*c|--command", t)]
    codes += [t.partition("=")[2] for t in texts if t.startswith("--command=")]
    return combine(j.script(code, feed) for code in codes)


def _source(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    """`source FILE`, `. FILE`: bash looks for a FILE without a slash on the PATH first."""
    if not args:
        return SAFE
    if args[0].text in ("-", "/dev/stdin"):
        return judge_shell(j, "sh", args[:1], feed)
    return script_file(j, name, args[0], j.script_at, search="first")


def _ssh(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    valued = {
        "-b",
        "-c",
        "-D",
        "-E",
        "-e",
        "-F",
        "-I",
        "-i",
        "-J",
        "-L",
        "-l",
        "-m",
        "-O",
        "-o",
        "-p",
        "-Q",
        "-R",
        "-S",
        "-W",
        "-w",
        "-B",
    }
    _, _, start = split_options(args, valued=valued)
    findings = []
    for option in (w.text for w in args if w.text.lower().startswith(("proxycommand=", "localcommand="))):
        findings.append(j.script(option.partition("=")[2]))
    remote = j.script(" ".join(w.text for w in args[start + 1 :])) if len(args) > start + 1 else SAFE
    if remote.tier != "safe":
        findings.append(
            Verdict("dangerous", f"runs a command on another machine that {remote.reason}", "remote_command")
        )
    return combine(findings)


# tests that pick some files out of a tree: `find ~ -name '*.pyc' -delete` does not empty the home
_NARROWING = {"-name", "-iname", "-path", "-ipath", "-wholename", "-regex", "-iregex", "-newer", "-mtime"}
_NARROWING |= {"-mmin", "-size", "-user", "-group", "-perm", "-empty", "-links", "-inum", "-samefile"}
_DELETERS = ("rm", "unlink", "shred", "rmdir")


def _find(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    texts = [w.text for w in args]
    first_test = next((i for i, t in enumerate(texts) if t.startswith(("-", "(", "!"))), len(texts))
    roots = args[:first_test] or [Word(".")]
    narrowed = any(t in _NARROWING for t in texts[first_test:])
    broad = None if narrowed else next((b for b in (broad_target(j, r) for r in roots) if b), None)
    findings: list[Verdict] = []
    i = first_test
    while i < len(texts):
        action = texts[i]
        if action == "-delete":
            findings += [_find_delete(broad, "find -delete"), *(j.write(r, "deletes") for r in roots)]
        elif action in ("-exec", "-execdir", "-ok", "-okdir"):
            end = next((k for k in range(i + 1, len(texts)) if texts[k] in (";", "+")), len(texts))
            inner = args[i + 1 : end]
            if inner and command_name(inner[0]) in _DELETERS:
                findings.append(_find_delete(broad, f"find {action} {command_name(inner[0])}"))
                findings += [j.write(r, "deletes") for r in roots]
            findings.append(j.run(inner, None))
            if broad is not None:  # `{}` may be the root itself: `find / -exec sh -c 'rm -rf {}' \;`
                rooted = j.run([Word(w.text.replace("{}", broad)) for w in inner], None)
                findings += [rooted] if rooted.tier == "hardline" else []
            i = end
        elif action in ("-fprint", "-fprint0", "-fprintf", "-fls") and i + 1 < len(args):
            findings.append(j.write(args[i + 1], "writes to"))
        i += 1
    return combine(findings)


def _find_delete(broad: str | None, how: str) -> Verdict:
    if broad is not None:
        return Verdict("hardline", f"deletes everything under {broad} ({how})", "rm_root")
    return Verdict("dangerous", f"deletes every file find matches ({how})", "find_delete")


def _xargs(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    """xargs runs its command with words read from stdin: known ones when the input is, else unknown ones."""
    valued = {"-a", "-d", "-E", "-e", "-I", "-L", "-l", "-n", "-P", "-s", "--arg-file", "--delimiter"}
    valued |= {"--max-args", "--max-procs", "--max-lines", "--max-chars", "--replace", "--eof"}
    _, values, start = split_options(args, valued=valued)
    command = args[start:]
    if not command:
        return SAFE  # runs echo
    replace = values.get("-I") or values.get("--replace") or values.get("-i")
    lines = feed.splitlines()[:8] if isinstance(feed, str) else None
    if replace and lines is not None:
        runs = [[Word(w.text.replace(replace, line)) for w in command] for line in lines]
    elif replace:
        runs = [[Word(w.text, replace in w.text) for w in command]]
    elif isinstance(feed, str):
        runs = [[*command, *(Word(w) for w in feed.split())]]
    else:
        runs = [[*command, Word("what xargs reads", dynamic=True)]]  # shown in the reason as it is
    verdict = combine(j.run(run, None) for run in runs)
    if command_name(command[0]) in _DELETERS and verdict.tier != "hardline":
        lists = Verdict(
            "dangerous", f"deletes every file another command lists (xargs {command[0].text})", "find_delete"
        )
        return combine([lists, *(v for v in [verdict] if v.key != "dynamic_write")])
    return verdict


def _git(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    from mibyan.tools.command_git import judge_git

    return judge_git(j, args, feed)


_RULES: dict[str, Rule] = {
    **dict.fromkeys(_WRAPPERS, _wrapper),
    "env": _env,
    "command": _command,
    "watch": _watch,
    "eval": _eval,
    "alias": _alias_or_trap,
    "trap": _alias_or_trap,
    "source": _source,
    **dict.fromkeys(["vi", "vim", "nvim", "view", "ex", "gvim"], _editor),
    "script": _script,
    ".": _source,
    "ssh": _ssh,
    **SYSTEM_RULES,
    "find": _find,
    "xargs": _xargs,
    "git": _git,
    "mibyan": lambda j, name, args, feed: judge_mibyan(args),
    **dict.fromkeys(SHELLS, lambda j, name, args, feed: judge_shell(j, name, args, feed)),
    **dict.fromkeys(["awk", "gawk", "mawk", "nawk"], lambda j, name, args, feed: judge_awk(j, args)),
    **TARGET_RULES,
}
KNOWN_NAMES = frozenset([*_RULES, *INTERPRETERS, "mkfs", "mke2fs", "mkswap", "wipefs"])


def _rule_for(name: str) -> Rule | None:
    rule = _RULES.get(name)
    if rule is not None:
        return rule
    if name.startswith(("mkfs", "mke2fs", "mkswap", "wipefs", "mkdosfs", "mkntfs")):
        return judge_disk
    if is_interpreter(name):
        return lambda j, name, args, feed: judge_interpreter(j, name, args, feed)
    return None


def judge_invocation(j: Judge, words: Sequence[Word], feed: Feed) -> Verdict:
    """Judge one command whose name is known: the rule for its name, or safe when it has none."""
    name = command_name(words[0])
    rule = _rule_for(name)
    verdict = rule(j, name, list(words[1:]), feed) if rule is not None else SAFE
    if "/" in words[0].text:  # `./run.sh`: what it runs is the file's text, unless it is a binary
        if words[0].dynamic or j.written(words[0]) is not None:
            verdict = combine([verdict, script_file(j, name, words[0], j.script_at)])
        else:
            verdict = combine([verdict, judge_program_file(j, words, j.script_at)])
    elif not words[0].dynamic:
        found = found_on_path(j, words[0].text)
        if found is not None:  # `.venv/bin/x`, found by name: what runs is that file
            verdict = combine([verdict, judge_program_file(j, [Word(str(found)), *words[1:]], j.script_at)])
    return verdict
