"""Which shell commands need the user's approval, and which never run at all.

A command is judged after normalisation, so disguises do not help: Unicode is NFKC-folded, `${IFS}` is a
space, quotes and backslashes are resolved the way the shell resolves them, chains (`;`, `&&`, `||`, `|`,
newlines), `$(...)` and backticks, `bash -c` / `sh -c` / `eval` strings, wrappers (`sudo`, `env`, `nohup`,
`xargs`, `timeout`, ...) and absolute paths to binaries are all looked through. Quoted text that is only an
argument (`echo "rm -rf /"`) is not a command and stays safe.

Two tiers: "hardline" commands never run, even with --yolo; "dangerous" ones run only when approved.
"""

from __future__ import annotations

import re
import shlex
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, cast

Tier = Literal["safe", "dangerous", "hardline"]


@dataclass(frozen=True)
class Verdict:
    """The judgement of one command: its tier, and for the user a reason with a stable key.

    `ask_every_time`: the user answers each such call; --yolo and earlier answers never cover it.
    """

    tier: Tier
    reason: str = ""
    key: str = ""
    ask_every_time: bool = False

    @property
    def needs_approval(self) -> bool:
        return self.tier == "dangerous"


SAFE = Verdict("safe")
OUTSIDE_SANDBOX_REASON = "runs outside the sandbox"


def outside_sandbox(verdict: Verdict) -> Verdict:
    """The verdict of a command that asks to run outside the sandbox: asked every time, own key."""
    also = f", and {verdict.reason}" if verdict.reason else ""
    return Verdict("dangerous", OUTSIDE_SANDBOX_REASON + also, "outside_sandbox", ask_every_time=True)


_SEPARATORS = {";", "&&", "||", "|", "&", "|&", "(", ")", "\n", "{", "}", ";;"}
_WRAPPERS = {
    "sudo",
    "doas",
    "env",
    "nohup",
    "xargs",
    "time",
    "nice",
    "ionice",
    "command",
    "exec",
    "builtin",
    "timeout",
    "stdbuf",
    "chronic",
    "unbuffer",
    "watch",
    "strace",
    "setsid",
    "caffeinate",
    "then",
    "do",
    "else",
    "!",
}
_SHELLS = {"sh", "bash", "zsh", "dash", "ksh", "fish", "busybox"}
_SCRIPT_RUNNERS = _SHELLS | {"python", "python3", "perl", "ruby", "node"}
_SYSTEM_DIRS = {
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/opt",
    "/proc",
    "/root",
    "/sbin",
    "/srv",
    "/sys",
    "/usr",
    "/var",
    "/usr/bin",
    "/usr/lib",
    "/usr/local",
    "/var/lib",
    "/System",
    "/Library",
    "/Users",
    "/Applications",
}
_HOME_FORMS = {"~", "~/", "$HOME", "${HOME}", "$HOME/", "${HOME}/"}
_DISK_DEVICE = re.compile(
    r"^/dev/(sd[a-z]|hd[a-z]|vd[a-z]|xvd[a-z]|nvme\d|mmcblk\d|disk\d|md\d|dm-\d|mapper/)"
)
_SENSITIVE_WRITE = re.compile(
    r"^(~|\$HOME|\$\{HOME\}|/root|/home/[^/]+)/(\.ssh(/|$)|\.bashrc$|\.zshrc$|\.profile$|\.bash_profile$|"
    r"\.zprofile$|\.bash_login$|\.config/fish/config\.fish$)|^/etc(/|$)|^/boot(/|$)|^/usr(/|$)"
)
_FORK_BOMB = re.compile(r"(\w+|:)\s*\(\s*\)\s*\{[^}]*\1\s*\|\s*\1\s*&[^}]*\}")
_SQL_DESTRUCTIVE = re.compile(r"\b(drop\s+(table|database|schema)|truncate\s+(table\s+)?\w)", re.IGNORECASE)
_SUBSTITUTION = re.compile(r"\$\(((?:[^()]|\([^()]*\))*)\)|`([^`]*)`|<\(([^()]*)\)")
_ZERO_WIDTH = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))


def normalize(command: str) -> str:
    """Fold the disguises that do not change what the shell runs."""
    text = unicodedata.normalize("NFKC", command).translate(_ZERO_WIDTH)
    text = re.sub(r"\$\{IFS\}|\$IFS\b", " ", text)
    return text.replace("\\\n", "")


def _tokens(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: judge the plain words rather than give up
        return command.replace('"', " ").replace("'", " ").split()


def _segments(tokens: list[str]) -> list[tuple[list[str], str]]:
    """Split tokens into simple commands, each with the operator that follows it."""
    segments: list[tuple[list[str], str]] = []
    current: list[str] = []
    for token in tokens:
        if token in _SEPARATORS or (set(token) <= set(";&|()\n") and token):
            segments.append((current, token))
            current = []
        else:
            current.append(token)
    segments.append((current, ""))
    return [(words, op) for words, op in segments if words]


def _strip_wrappers(words: list[str]) -> tuple[list[str], bool]:
    """Drop `VAR=value`, wrappers and their options; return the real command and whether sudo was used."""
    elevated = False
    i = 0
    while i < len(words):
        word = words[i]
        base = word.rsplit("/", 1)[-1]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word):
            i += 1
        elif base in _WRAPPERS:
            elevated |= base in ("sudo", "doas")
            i += 1
            if base == "timeout":
                while i < len(words) and (words[i].startswith("-") or re.match(r"^\d", words[i])):
                    i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 1
                if base in ("sudo", "doas") and words[i - 1] in ("-u", "-g") and i < len(words):
                    i += 1
        else:
            break
    return words[i:], elevated


def _flags(args: list[str]) -> set[str]:
    flags: set[str] = set()
    for arg in args:
        if arg.startswith("--"):
            flags.add(arg)
        elif arg.startswith("-") and len(arg) > 1:
            flags.update(f"-{c}" for c in arg[1:])
    return flags


def _is_broad(path: str) -> bool:
    stripped = path.rstrip("/") or "/"
    return (
        stripped in _SYSTEM_DIRS
        or path in _HOME_FORMS
        or stripped in ("~", "$HOME", "${HOME}", "/*", "*", ".", "..", "~/*", "$HOME/*")
        or re.match(r"^/(\*|[a-z]+/?\*)$", path) is not None
        or re.match(r"^/home/[^/]+/?$", path) is not None
    )


def _judge_rm(args: list[str]) -> Verdict:
    flags = _flags(args)
    recursive = bool(flags & {"-r", "-R", "--recursive"})
    targets = [a for a in args if not a.startswith("-")]
    if (recursive and any(_is_broad(t) for t in targets)) or "--no-preserve-root" in flags:
        return Verdict("hardline", "recursive delete of the root, your home or a system directory", "rm_root")
    if recursive:
        return Verdict("dangerous", "recursive delete", "rm_recursive")
    if any(t.rstrip("/") in _SYSTEM_DIRS for t in targets):
        return Verdict("dangerous", "delete in a system directory", "rm_system")
    return SAFE


def _judge_words(words: list[str], next_op: str, following: list[str]) -> Verdict:
    command_words, elevated = _strip_wrappers(words)
    if not command_words:
        return Verdict("dangerous", "runs a command as root", "sudo") if elevated else SAFE
    name = command_words[0].rsplit("/", 1)[-1]
    args = command_words[1:]
    verdict = _judge_command(name, args, next_op, following)
    if verdict.tier == "safe" and elevated:
        return Verdict("dangerous", "runs a command as root", "sudo")
    return verdict


def _judge_command(name: str, args: list[str], next_op: str, following: list[str]) -> Verdict:
    flags = _flags(args)
    if name in _SHELLS | {"eval"} or (name in ("python", "python3") and "-c" in args):
        inner = args[args.index("-c") + 1] if "-c" in args and args.index("-c") + 1 < len(args) else None
        if name == "eval":
            inner = " ".join(args)
        if inner is not None:
            if name in ("python", "python3"):
                return _judge_python(inner)
            return classify_command(inner)
    if name == "rm":
        return _judge_rm(args)
    if name.startswith("mkfs") or (
        name in ("mkswap", "wipefs", "fdisk", "sfdisk", "parted", "shred")
        and any(_DISK_DEVICE.match(a) for a in args)
    ):
        return Verdict("hardline", "formats or wipes a disk", "disk")
    if name == "dd" and any(a.startswith("of=/dev/") and not a.startswith("of=/dev/null") for a in args):
        return Verdict("hardline", "writes raw data onto a device", "disk")
    if name in ("shutdown", "reboot", "halt", "poweroff") or (name == "init" and args[:1] in (["0"], ["6"])):
        return Verdict("hardline", "shuts down or restarts the machine", "power")
    if name == "systemctl" and args[:1] and args[0] in ("poweroff", "reboot", "halt", "kexec"):
        return Verdict("hardline", "shuts down or restarts the machine", "power")
    if name in ("kill", "pkill", "killall") and "-1" in args:
        return Verdict("hardline", "kills every process", "kill_all")
    recursive = bool(flags & {"-R", "--recursive"})
    if name in ("chmod", "chown", "chgrp") and recursive and any(_is_broad(a) for a in args if a[:1] != "-"):
        return Verdict("dangerous", f"recursive {name} on a broad path", "chmod_broad")
    if name in ("curl", "wget", "fetch") and next_op in ("|", "|&") and following:
        runner, _ = _strip_wrappers(following)
        if runner and runner[0].rsplit("/", 1)[-1] in _SCRIPT_RUNNERS:
            return Verdict("dangerous", "runs a script downloaded from the network", "pipe_to_shell")
    if name == "git" and args:
        sub = args[0]
        if sub == "push" and (
            flags & {"-f", "--force", "--force-with-lease", "--mirror", "--delete", "-d"}
            or any(a.startswith("+") or a.startswith("--force") for a in args[1:])
        ):
            return Verdict("dangerous", "force-pushes or deletes remote history", "git_force_push")
        if sub == "reset" and "--hard" in args:
            return Verdict("dangerous", "discards uncommitted changes (git reset --hard)", "git_reset_hard")
        if sub == "clean" and flags & {"-f", "--force"}:
            return Verdict("dangerous", "deletes untracked files (git clean -f)", "git_clean")
        if sub in ("checkout", "restore") and ("." in args[1:] or ("--" in args[1:] and "." in args)):
            return Verdict("dangerous", "discards uncommitted changes", "git_discard")
    if name in ("tee", "cp", "mv", "install", "ln", "truncate") and any(
        _SENSITIVE_WRITE.match(a) for a in args[1 if name != "tee" else 0 :] if not a.startswith("-")
    ):
        return Verdict("dangerous", "writes to a system or shell start-up file", "sensitive_write")
    if (
        name == "sed"
        and (flags & {"-i"} or any(a.startswith("-i") for a in args))
        and any(_SENSITIVE_WRITE.match(a) for a in args)
    ):
        return Verdict("dangerous", "writes to a system or shell start-up file", "sensitive_write")
    if name == "find" and ("-delete" in args or ("-exec" in args and "rm" in args)):
        return Verdict("dangerous", "deletes every file find matches", "find_delete")
    if name in ("su", "passwd", "visudo", "usermod", "userdel", "crontab") and (
        name != "crontab" or "-r" in args
    ):
        return Verdict("dangerous", f"changes users or system settings ({name})", "system_admin")
    return SAFE


def _judge_python(code: str) -> Verdict:
    if re.search(r"shutil\.rmtree\(\s*['\"](/|~)['\"]|os\.system\(|subprocess\.", code):
        inner = re.findall(r"(?:os\.system|subprocess\.\w+)\(\s*['\"]([^'\"]+)['\"]", code)
        verdicts = [classify_command(c) for c in inner]
        worst = _worst(verdicts)
        if worst.tier != "safe":
            return worst
        if "rmtree" in code:
            return Verdict("hardline", "recursive delete of the root or your home", "rm_root")
    return SAFE


def _redirect_targets(tokens: list[str]) -> list[str]:
    return [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t in (">", ">>", ">|", "&>", ">&", "&>>")]


def _worst(verdicts: list[Verdict]) -> Verdict:
    for tier in ("hardline", "dangerous"):
        for verdict in verdicts:
            if verdict.tier == tier:
                return verdict
    return SAFE


def classify_command(command: str) -> Verdict:
    """Judge a shell command: "safe", "dangerous" (ask first) or "hardline" (never run)."""
    text = normalize(command)
    verdicts: list[Verdict] = []
    if _FORK_BOMB.search(text.replace(" ", "")) or _FORK_BOMB.search(text):
        return Verdict("hardline", "a fork bomb", "fork_bomb")
    for match in _SUBSTITUTION.finditer(text):
        inner = next(group for group in match.groups() if group is not None)
        verdicts.append(classify_command(inner))
    if _SQL_DESTRUCTIVE.search(text):
        verdicts.append(Verdict("dangerous", "drops or truncates database data", "sql_destructive"))
    tokens = _tokens(text.replace("`", " ` "))
    for target in _redirect_targets(tokens):
        if _DISK_DEVICE.match(target):
            verdicts.append(Verdict("hardline", "writes raw data onto a disk device", "disk"))
        elif _SENSITIVE_WRITE.match(target):
            verdicts.append(
                Verdict("dangerous", "writes to a system or shell start-up file", "sensitive_write")
            )
    segments = _segments([t for t in tokens if t != "`"])
    for index, (words, op) in enumerate(segments):
        words = [w for w in words if w not in (">", ">>", "<", "2>", "&>")]
        following = segments[index + 1][0] if index + 1 < len(segments) else []
        verdicts.append(_judge_words(words, op, following))
    return _worst(verdicts)


Answer = Literal["once", "session", "always", "deny"]


class ApprovalPolicy:
    """Decides whether a dangerous command may run: --yolo, earlier answers, or asking the user.

    "session" answers last for this agent; "always" answers are saved in the user's config.yaml under
    `approvals.always`. Without a callback (and without --yolo) the answer is deny. A user who does not
    answer within `timeout` seconds has denied.
    """

    def __init__(
        self,
        *,
        ask: Callable[[str, str], Any] | None,
        yolo: bool,
        always: list[str],
        timeout: float,
        save_always: Callable[[str], None],
    ) -> None:
        self._ask = ask
        self.yolo = yolo
        self._approved = set(always)
        self._timeout = timeout
        self._save_always = save_always
        self._lock = threading.Lock()

    def decide(self, command: str, verdict: Verdict) -> tuple[bool, str]:
        """(allowed, why). Hardline commands are never allowed."""
        if verdict.tier == "hardline":
            return False, f"blocked: {verdict.reason}; mibyan never runs this"
        if verdict.tier == "safe":
            return True, ""
        if verdict.ask_every_time and self._ask is None:
            return False, f"not run: it {verdict.reason}; the user must say yes each time, even with --yolo"
        if self.yolo and not verdict.ask_every_time:
            return True, "approved by --yolo"
        with self._lock:  # one question at a time, and a second call of the same kind sees the answer
            if verdict.key in self._approved and not verdict.ask_every_time:
                return True, "approved earlier"
            if self._ask is None:
                return False, (
                    "refused: nobody could be asked to approve it (no terminal; use --yolo or run "
                    f"interactively) — the command was not run ({verdict.reason})"
                )
            answer = self._ask_user(command, verdict.reason)
            if verdict.ask_every_time and answer != "deny":
                return True, "approved by user (this once)"
            if answer in ("session", "always"):
                self._approved.add(verdict.key)
            if answer == "always":
                self._save_always(verdict.key)
        if answer == "deny":
            return False, f"denied by user: the command was not run ({verdict.reason})"
        return True, f"approved by user ({answer})"

    def carry_over_from(self, other: ApprovalPolicy) -> None:
        """Keep what the user decided on `other` (--yolo, "for this session" answers) when it is replaced."""
        self.yolo = other.yolo
        with self._lock:
            self._approved.update(other._approved)

    def answer_from_session(self, command: str, reason: str) -> Answer:
        """An approval callback for subagents: yes for what this user approved for the session, else no.

        Running outside the sandbox is never approved on the user's behalf.
        """
        if reason.startswith(OUTSIDE_SANDBOX_REASON):
            return "deny"
        # the same judgement as the question's, so a file tool's question cannot borrow a command's grant
        verdict = classify_command(command)
        return "once" if verdict.key in self._approved and verdict.reason == reason else "deny"

    def _ask_user(self, command: str, reason: str) -> Answer:
        if self._ask is None:
            return "deny"
        ask = self._ask
        box: list[Any] = []
        worker = threading.Thread(
            target=lambda: box.append(ask(command, reason)), daemon=True, name="mibyan-approval"
        )
        worker.start()
        worker.join(self._timeout)
        answer = box[0] if box else "deny"
        if answer == "once" or answer == "session" or answer == "always":
            return cast(Answer, answer)
        return "deny"
