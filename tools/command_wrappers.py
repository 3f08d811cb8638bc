"""The programs that run another command or shell code later or elsewhere: wrappers, env, at, parallel.

A wrapper (`sudo`, `nice`, `timeout`, `chrt`'s kin that have a row) runs the command after its own
options, which is judged in turn; one with no row is judged by tools/command_unknown.py. Adding a
wrapper is one row of `_WRAPPERS` with its examples.
"""

from __future__ import annotations

import re

from mibyan.tools.command_files import script_file
from mibyan.tools.command_spec import Scan, Spec, spec
from mibyan.tools.command_words import Feed, Judge, combine
from mibyan.tools.verdict import SAFE, Tier, Verdict

#: The programs that run a command after their own options: (names, options that take a value,
#: operands before the command, options that make them run nothing, examples). Adding one is a line.
_WRAPPERS: list[tuple[str, str, int, str, dict[str, Tier]]] = [
    ("sudo", "-u -g -C -h -p -r -t -U -D -R -T --user --group --host --prompt --role --chdir", 0, "", {}),
    ("doas", "-u -C", 0, "", {}),
    ("pkexec", "--user", 0, "", {}),
    ("run0", "-u -D --user --unit --property --description --slice --chdir --setenv", 0, "", {}),
    ("nice", "-n --adjustment", 0, "", {"nice -n 5 rm -rf /": "hardline"}),
    ("ionice", "-c -n -p -P -u -t --class --classdata", 0, "", {"ionice -c3 rm -rf ~": "hardline"}),
    ("timeout", "-s -k --signal --kill-after", 1, "", {"timeout -s KILL 5 rm -rf /": "hardline"}),
    ("nohup", "", 0, "", {}),
    ("time", "-f -o --format --output", 0, "", {}),
    ("exec", "-a", 0, "", {"exec -a x rm -rf /": "hardline"}),
    ("builtin", "", 0, "", {}),
    ("coproc", "", 0, "", {}),
    ("stdbuf", "-i -o -e --input --output --error", 0, "", {"stdbuf -oL rm -rf /": "hardline"}),
    ("chronic", "", 0, "", {}),
    ("unbuffer", "", 0, "", {}),
    ("setsid", "", 0, "", {}),
    ("caffeinate", "-w -t", 0, "", {}),
    ("strace", "-o -e -p -s -u -a -b -E -I -O -P -S -X", 0, "", {"strace -f -o t.log rm -rf /": "hardline"}),
    ("ltrace", "-o -e -p -s -u -a -n", 0, "", {}),
    ("chroot", "--userspec --groups", 1, "", {"chroot /srv/jail rm -rf /": "hardline"}),
    ("unshare", "", 0, "", {}),
    ("nsenter", "-t -S -G --target", 0, "", {}),
    ("systemd-run", "-p -u -E --unit --property --description --slice --setenv -M", 0, "", {}),
    ("firejail", "", 0, "", {}),
    ("busybox", "", 0, "", {"busybox rm -rf /": "hardline"}),
    ("toybox", "", 0, "", {}),
    ("flock", "-w -E --timeout --conflict-exit-code", 1, "", {"flock /tmp/lock -c 'rm -rf ~'": "hardline"}),
    ("taskset", "", 1, "-p --pid", {"taskset -c 0 rm -rf /": "hardline"}),
    ("valgrind", "", 0, "", {}),
    ("catchsegv", "", 0, "", {}),
    ("xvfb-run", "-n -s -e -f -p", 0, "", {}),
    (
        "runuser",
        "-u -g -G -s -w --user --group --supp-group --shell",
        0,
        "",
        {"runuser -u me -- rm -rf /": "hardline"},
    ),
]
_ELEVATING = {"sudo", "doas", "pkexec", "run0", "runuser"}
_CARRYING_CODE = {"flock", "runuser"}  # `flock F -c CODE`, `runuser -u U -c CODE`


def _wrapper_spec(name: str, valued: str, skip: int, harmless: str, examples: dict[str, Tier]) -> Spec:
    command = f"{name} rm -r build" if skip == 0 else f"{name} x rm -r build"
    quiet = f"{name} ls -la" if skip == 0 else f"{name} x ls -la"
    return spec(
        name,
        valued=valued,
        code="-c --command" if name in _CARRYING_CODE else "",
        operands="runs",
        skip=skip,
        harmless=harmless,
        elevates=name in _ELEVATING,
        should_match={command: "dangerous", **examples},
        should_not_match=[] if name in _ELEVATING else [quiet],
    )


def _env(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    from mibyan.tools.command_git import changes_git_guard

    for split in scan.given("-S", "--split-string"):
        # `env -S "rm -rf /"`: the string is split into words like a tiny shell
        return j.script(" ".join([split.text, *(w.text for w in scan.args[scan.start :])]), feed)
    changed = [w.text for w in scan.given("-u", "--unset")]
    clears = bool({"-i", "--ignore-environment"} & scan.flags)
    command = scan.args[scan.start :]
    while command and (command[0].text == "-" or _ASSIGNMENT.match(command[0].text)):
        clears |= command[0].text == "-"
        changed.append(command[0].text.partition("=")[0])
        command = command[1:]
    return combine([changes_git_guard(changed, clears=clears), j.run(command, feed)])


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _at(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    """`at TIME`, `batch`: the commands they read (stdin or `-f FILE`) run later, unasked."""
    if {"-l", "-d", "-r", "-c"} & scan.flags or name in ("atq", "atrm"):
        return SAFE  # lists, shows or removes jobs
    later = Verdict("dangerous", f"schedules commands to run later by themselves ({name})", "system_admin")
    files = scan.given("-f")
    inner = [script_file(j, name, w, j.script_at) for w in files]
    if not files and isinstance(feed, str):
        inner.append(j.script(feed))
    return combine([*(v for v in inner if v.tier == "hardline"), later])


def _parallel(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    """GNU parallel: its command (words, or one string) with each argument after `:::` put in for `{}`."""
    words = scan.args[scan.start :]
    texts = [w.text for w in words]
    cut = texts.index(":::") if ":::" in texts else len(texts)
    command, values = texts[:cut], [t for t in texts[cut + 1 :] if t not in (":::", "::::")] or [""]
    lines = []
    for value in values[:8]:
        line = " ".join(command)
        lines.append(line.replace("{}", value) if "{}" in line else f"{line} {value}".strip())
    return combine(j.script(line, feed) for line in lines if line)


WRAPPER_SPECS: tuple[Spec, ...] = (
    *(_wrapper_spec(*row) for row in _WRAPPERS),
    spec(
        "env",
        valued="-u -C --unset --chdir -S --split-string",
        ordered=True,
        check=_env,
        should_match={"env -S 'rm -rf /'": "hardline", "env -i PATH=/bin rm -rf ~": "hardline"},
        should_not_match=["env", "env FOO=1 make test"],
    ),
    spec(
        "command",
        operands="runs",
        harmless="-v -V",
        should_match={"command -p rm -rf /": "hardline"},
        should_not_match=["command -v rm", "command ls"],
    ),
    spec(
        "watch",
        valued="-n --interval -q --equexit",
        operands="script",
        should_match={"watch -n 1 rm -rf /": "hardline", "watch 'rm -r build'": "dangerous"},
        should_not_match=["watch -n 2 ls -la"],
    ),
    spec(
        "at batch atq atrm",
        valued="-f -q -t -M",
        check=_at,
        should_match={"at now <<< 'rm -rf /'": "hardline", "echo 'make' | at midnight": "dangerous"},
        should_not_match=["atq", "at -l"],
    ),
    spec(
        "parallel",
        valued="-j -J -S -a -d -E -I -N -n -P --jobs --sshlogin --arg-file --delimiter --joblog",
        ordered=True,
        check=_parallel,
        should_match={"parallel -j1 'rm -rf {}' ::: /": "hardline", "parallel rm -r ::: build": "dangerous"},
        should_not_match=["parallel gzip ::: a.txt b.txt", "parallel -j4 'echo {}' ::: 1 2"],
    ),
)
