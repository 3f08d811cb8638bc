"""Rules for commands that change the machine itself: deleting, disks, power, processes, users, data.

Each rule takes the judge, the command's name, its argument words and its standard input, and returns
the verdict (see tools/command_rules.py for how rules are chosen).
"""

from __future__ import annotations

import re

from mibyan.tools.approval import SAFE, Verdict
from mibyan.tools.command_paths import broad_target, in_system_tree, is_disk
from mibyan.tools.command_targets import operands
from mibyan.tools.command_words import Feed, Judge, Stream, Word, combine, split_options

POWER = {"shutdown", "reboot", "halt", "poweroff"}
DISK_TOOLS = {"fdisk", "sfdisk", "cfdisk", "parted", "gdisk", "sgdisk", "blkdiscard", "badblocks", "shred"}
ADMIN = {
    "su",
    "passwd",
    "visudo",
    "usermod",
    "userdel",
    "useradd",
    "groupdel",
    "chpasswd",
    "chsh",
    "runuser",
}
SQL_CLIENTS = {"psql", "mysql", "mariadb", "sqlite3", "sqlcmd", "duckdb", "clickhouse-client", "cockroach"}
_SQL = re.compile(
    r"\b(drop\s+(table|database|schema)|truncate\s+(table\s+)?\w|delete\s+from\s+[\w.\"`]+\s*(;|$)|"
    r"flushall|flushdb|dropdatabase)",
    re.IGNORECASE,
)
_SQL_WRITES = re.compile(
    r"\b(insert|update|delete|drop|create|alter|replace|attach|vacuum|pragma|reindex)\b|\.(restore|import)\b",
    re.IGNORECASE,
)


def _rm(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    flags, _, _ = split_options(args, stop_at_positional=False)
    targets = operands(args, set())
    recursive = name == "rm" and bool({"-r", "-R", "--recursive"} & set(flags))
    findings = [j.write(w, "deletes") for w in targets]
    if recursive or name in ("rmdir",):
        for word in targets:
            guessed = (broad_target(j, Word(g)) for g in word.guesses)
            broad = broad_target(j, word) or next((b for b in guessed if b), None)
            if broad is not None:
                return Verdict(
                    "hardline",
                    f"deletes the root, your home or a system folder ({broad}) and all in it",
                    "rm_root",
                )
    if "--no-preserve-root" in flags:
        return Verdict("hardline", "deletes the root folder and all in it (rm --no-preserve-root)", "rm_root")
    if recursive:
        findings.append(Verdict("dangerous", "deletes a folder and everything in it (rm -r)", "rm_recursive"))
    elif any(not w.dynamic and any(in_system_tree(p) for p in j.resolve(w.text)) for w in targets):
        findings.append(Verdict("dangerous", f"deletes files in a system folder ({name})", "rm_system"))
    return combine(findings)


def judge_disk(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    if name.startswith(("mkfs", "mke2fs", "mkswap", "wipefs", "mkdosfs", "mkntfs")):
        return Verdict("hardline", f"formats or wipes a disk ({name})", "disk")
    devices = [w.text for w in args if is_disk(w.text) or w.text.startswith("/dev/disk")]
    listing = any(w.text in ("-l", "--list", "print", "-p") for w in args)
    if devices and not listing:
        return Verdict("hardline", f"rewrites or wipes a disk ({name} {devices[0]})", "disk")
    return combine(j.write(w, "destroys") for w in args if name == "shred" and not w.text.startswith("-"))


def _dd(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    return combine(
        j.write(Word(w.text[3:], w.dynamic, w.pattern, tuple(g[3:] for g in w.guesses)), "writes to")
        for w in args
        if w.text.startswith("of=")
    )


def _power(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    positional = [w.text for w in args if not w.text.startswith("-")]
    if name in POWER or (name in ("init", "telinit") and positional[:1] in (["0"], ["6"])):
        return Verdict("hardline", f"shuts down or restarts the machine ({name})", "power")
    stops = {"poweroff", "reboot", "halt", "kexec", "suspend", "hibernate", "soft-reboot"}
    if name in ("systemctl", "loginctl") and positional[:1] and positional[0] in stops:
        return Verdict("hardline", f"shuts down or restarts the machine ({name} {positional[0]})", "power")
    targets = [t for t in positional[1:] if t.removesuffix(".target") in stops]
    if name == "systemctl" and positional[:1] and positional[0] in ("start", "isolate") and targets:
        return Verdict("hardline", f"shuts down or restarts the machine (systemctl {targets[0]})", "power")
    return SAFE


def _kill(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    texts = [w.text for w in args]
    if name == "killall5":
        return Verdict("hardline", "kills every process (killall5)", "kill_all")
    i = 0
    if texts[:1] and texts[0].startswith("-") and texts[0] != "--":
        i = 2 if texts[0] in ("-s", "-n", "--signal") else 1
    pids = [t for t in texts[i:] if t != "--"]
    if name == "kill" and "-1" in pids:
        return Verdict("hardline", "kills every process you may kill (kill -1)", "kill_all")
    if name in ("pkill", "killall"):
        return _kill_by_name(name, texts)
    return SAFE


_MATCHES_ANYTHING = {"", ".", ".*", "^", "$", ".+", "^.*", "^.*$", "*"}
_KILL_VALUED = {
    "-s",
    "-n",
    "--signal",
    "-u",
    "--user",
    "-U",
    "--uid",
    "-g",
    "--pgroup",
    "-G",
    "--group",
    "-P",
    "--parent",
    "-t",
    "--terminal",
    "-o",
    "--older-than",
    "-y",
    "--younger-than",
}


def _kill_by_name(name: str, texts: list[str]) -> Verdict:
    """`pkill PATTERN` / `killall NAME`: a pattern that matches anything, or a user alone, is everything."""
    patterns: list[str] = []
    by_owner = False
    i = 0
    while i < len(texts):
        text = texts[i]
        if text in _KILL_VALUED:
            by_owner |= text in ("-u", "--user", "-U", "--uid")
            i += 2
            continue
        if not text.startswith("-") or text in ("-", ""):
            patterns.append(text)
        i += 1
    if any(p in _MATCHES_ANYTHING for p in patterns) or (by_owner and not patterns):
        return Verdict("hardline", f"kills every process ({name} {' '.join(texts)})", "kill_all")
    return Verdict("dangerous", f"kills the processes that match ({name})", "kill_by_name")


def _chmod(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    flags, _, _ = split_options(args, stop_at_positional=False)
    positional = [w for w in args if not w.text.startswith("-")]
    targets = positional if any(f.startswith("--reference") for f in flags) else positional[1:]
    findings = [j.write(w, "changes the permissions of") for w in targets]
    if {"-R", "--recursive"} & set(flags):
        for word in targets:
            broad = broad_target(j, word)
            here = any(p in (c, *c.parents) for p in j.resolve(word.text) for c in j.resolve("."))
            if broad is not None or here:
                findings.append(
                    Verdict(
                        "dangerous",
                        f"changes the owner or permissions of all files in {broad or word.text} ({name} -R)",
                        "chmod_broad",
                    )
                )
    return combine(findings)


def _admin(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    if name == "crontab" and any(w.text in ("-l", "--list") for w in args):
        return SAFE
    found = Verdict("dangerous", f"changes users or system settings ({name})", "system_admin")
    if name == "crontab":
        found = Verdict("dangerous", "replaces or removes your scheduled jobs (crontab)", "system_admin")
    _, values, _ = split_options(args, valued={"-c", "--command", "-u", "-s", "-g"})
    inner = values.get("-c") or values.get("--command")
    return combine([found, j.script(inner, feed)]) if inner else found


def _sql(j: Judge, name: str, args: list[Word], feed: Feed) -> Verdict:
    texts = [w.text for w in args] + ([feed] if isinstance(feed, str) else [])
    findings = []
    if any(_SQL.search(text) for text in texts):
        findings.append(Verdict("dangerous", f"drops or empties database tables ({name})", "sql_destructive"))
    files = [w for w in args if not w.text.startswith("-")]
    if name == "sqlite3" and files:
        sql = " ".join([*(w.text for w in files[1:]), feed if isinstance(feed, str) else ""])
        if not sql.strip() or _SQL_WRITES.search(sql) or isinstance(feed, Stream):
            findings.append(j.write(files[0], "changes"))
    return combine(findings)


SYSTEM_RULES = {
    "rm": _rm,
    "unlink": _rm,
    "rmdir": _rm,
    **dict.fromkeys(DISK_TOOLS, judge_disk),
    "dd": _dd,
    **dict.fromkeys([*POWER, "init", "telinit", "systemctl", "loginctl"], _power),
    **dict.fromkeys(["kill", "pkill", "killall", "killall5"], _kill),
    **dict.fromkeys(["chmod", "chown", "chgrp", "chattr"], _chmod),
    **dict.fromkeys([*ADMIN, "crontab"], _admin),
    **dict.fromkeys(SQL_CLIENTS, _sql),
}
