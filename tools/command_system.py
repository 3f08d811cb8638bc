"""The programs that change the machine itself: deleting, disks, power, processes, users, data.

Each is a spec (tools/command_spec.py) with its examples; what its roles cannot say is its check, which
sees the words as the one scanner read them (see tools/command_rules.py for how specs are chosen).
"""

from __future__ import annotations

import re

from mibyan.tools.command_paths import broad_target, in_system_tree, is_disk
from mibyan.tools.command_spec import Scan, Spec, spec
from mibyan.tools.command_words import Feed, Judge, Stream, Word, combine
from mibyan.tools.verdict import SAFE, Verdict

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


def _rm(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    targets = scan.operands  # each is judged as a file deleted by the spec's role
    recursive = name == "rm" and bool({"-r", "-R", "--recursive"} & scan.flags)
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
    if "--no-preserve-root" in scan.flags:
        return Verdict("hardline", "deletes the root folder and all in it (rm --no-preserve-root)", "rm_root")
    if recursive:
        return Verdict("dangerous", "deletes a folder and everything in it (rm -r)", "rm_recursive")
    if any(not w.dynamic and any(in_system_tree(p) for p in j.resolve(w.text)) for w in targets):
        return Verdict("dangerous", f"deletes files in a system folder ({name})", "rm_system")
    return SAFE


FORMATTERS = ("mkfs", "mke2fs", "mkswap", "wipefs", "mkdosfs", "mkntfs")


def _disk(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    if name.startswith(FORMATTERS):
        return Verdict("hardline", f"formats or wipes a disk ({name})", "disk")
    devices = [w.text for w in scan.args if is_disk(w.text) or w.text.startswith("/dev/disk")]
    listing = bool({"-l", "--list", "-p"} & scan.flags) or any(w.text == "print" for w in scan.operands)
    if devices and not listing:
        return Verdict("hardline", f"rewrites or wipes a disk ({name} {devices[0]})", "disk")
    return combine(j.write(w, "destroys") for w in scan.operands if name == "shred")


def _power(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    positional = [w.text for w in scan.operands]
    if name in POWER or (name in ("init", "telinit") and positional[:1] in (["0"], ["6"])):
        return Verdict("hardline", f"shuts down or restarts the machine ({name})", "power")
    stops = {"poweroff", "reboot", "halt", "kexec", "suspend", "hibernate", "soft-reboot"}
    if name in ("systemctl", "loginctl") and positional[:1] and positional[0] in stops:
        return Verdict("hardline", f"shuts down or restarts the machine ({name} {positional[0]})", "power")
    targets = [t for t in positional[1:] if t.removesuffix(".target") in stops]
    if name == "systemctl" and positional[:1] and positional[0] in ("start", "isolate") and targets:
        return Verdict("hardline", f"shuts down or restarts the machine (systemctl {targets[0]})", "power")
    if name == "systemctl" and positional[:1] and positional[0] in _STARTS_LATER:
        # a unit enabled or edited starts by itself later (at boot, at login), whatever it runs
        reason = f"makes a service start by itself later (systemctl {positional[0]})"
        return Verdict("dangerous", reason, "system_admin")
    return SAFE


_STARTS_LATER = {"enable", "reenable", "link", "edit", "preset", "preset-all", "set-environment", "revert"}


def _kill(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    texts = [w.text for w in scan.args]
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


def _chmod(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    positional = scan.operands
    targets = positional if "--reference" in scan.flags else positional[1:]
    findings = [j.write(w, "changes the permissions of") for w in targets]
    if {"-R", "--recursive"} & scan.flags:
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


def _admin(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    if name == "crontab":
        return Verdict("dangerous", "replaces or removes your scheduled jobs (crontab)", "system_admin")
    return Verdict("dangerous", f"changes users or system settings ({name})", "system_admin")


def _sql(j: Judge, name: str, scan: Scan, feed: Feed) -> Verdict:
    texts = [w.text for w in scan.args] + ([feed] if isinstance(feed, str) else [])
    findings = []
    if any(_SQL.search(text) for text in texts):
        findings.append(Verdict("dangerous", f"drops or empties database tables ({name})", "sql_destructive"))
    files = [w for w in scan.args if not w.text.startswith("-")]
    if name == "sqlite3" and files:
        sql = " ".join([*(w.text for w in files[1:]), feed if isinstance(feed, str) else ""])
        if not sql.strip() or _SQL_WRITES.search(sql) or isinstance(feed, Stream):
            findings.append(j.write(files[0], "changes"))
    return combine(findings)


SYSTEM_SPECS: tuple[Spec, ...] = (
    spec(
        "rm unlink rmdir",
        operands="deletes",
        check=_rm,
        should_match={
            "rm -rf /": "hardline",
            "rm -rf ~/": "hardline",
            "rm -r --no-preserve-root x": "hardline",
            "rmdir /usr": "hardline",
            "rm -r build": "dangerous",
            "rm /etc/hosts": "dangerous",
        },
        should_not_match=["rm build.o", "rm -f *.pyc", "rmdir empty"],
    ),
    spec(
        " ".join(sorted(DISK_TOOLS)) + " " + " ".join(FORMATTERS),
        check=_disk,
        should_match={
            "mkfs.ext4 /dev/sda1": "hardline",
            "fdisk /dev/sda": "hardline",
            "shred ~/.bashrc": "dangerous",
        },
        should_not_match=["fdisk -l /dev/sda", "parted /dev/sda print", "shred notes.txt"],
    ),
    spec(
        "dd",
        writes="of=",
        should_match={"dd if=/dev/zero of=/dev/sda": "hardline", "dd if=x of=~/.bashrc": "dangerous"},
        should_not_match=["dd if=/dev/zero of=disk.img bs=1M count=1", "dd if=/dev/sda of=/dev/null"],
    ),
    spec(
        " ".join([*sorted(POWER), "init", "telinit", "systemctl", "loginctl"]),
        check=_power,
        should_match={
            "systemctl --user enable ./x.service": "dangerous",
            "shutdown -h now": "hardline",
            "init 0": "hardline",
            "systemctl start reboot.target": "hardline",
        },
        should_not_match=["systemctl status nginx", "init --version"],
    ),
    spec(
        "kill pkill killall killall5",
        check=_kill,
        should_match={"kill -9 -1": "hardline", "pkill -u me": "hardline", "pkill python": "dangerous"},
        should_not_match=["kill 1234", "kill -s TERM 1234"],
    ),
    spec(
        "chmod chown chgrp chattr",
        check=_chmod,
        should_match={"chmod -R 777 /": "dangerous", "chmod 600 ~/.ssh/config": "dangerous"},
        should_not_match=["chmod +x run.sh", "chown -R me build"],
    ),
    spec(
        " ".join(sorted(ADMIN)),
        valued="-u -s -g",
        code="-c --command",
        check=_admin,
        should_match={"su -c 'rm -rf /' root": "hardline", "passwd": "dangerous"},
    ),
    spec(
        "crontab",
        valued="-u",
        harmless="-l --list",
        check=_admin,
        should_match={"crontab jobs.txt": "dangerous", "crontab -r": "dangerous"},
        should_not_match=["crontab -l"],
    ),
    spec(
        " ".join(sorted(SQL_CLIENTS)),
        check=_sql,
        should_match={
            "psql -c 'DROP TABLE users'": "dangerous",
            "sqlite3 ~/.mibyan/state.db 'delete from x'": "hardline",
        },
        should_not_match=["psql -c 'select 1'", "sqlite3 data.db 'select 1'"],
    ),
)
