"""What a path a command touches means: a disk, the root or a home, a start-up file, mibyan's own files.

These are the judgements of paths the command judge makes once the path is known; which words of a
command are its targets is the rules' business (tools/command_rules.py).
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import os
import re
from pathlib import Path, PurePosixPath

from mibyan.tools.command_words import Judge, Word
from mibyan.tools.path_policy import HOME_STARTUP
from mibyan.tools.verdict import SAFE, Verdict

SYSTEM_DIRS = frozenset(
    {
        "/",
        "/bin",
        "/boot",
        "/dev",
        "/etc",
        "/home",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/opt",
        "/proc",
        "/root",
        "/sbin",
        "/srv",
        "/sys",
        "/usr",
        "/var",
        "/mnt",
        "/media",
        "/run",
        "/snap",
        "/usr/bin",
        "/usr/sbin",
        "/usr/lib",
        "/usr/local",
        "/usr/share",
        "/var/lib",
        "/var/log",
        "/System",
        "/Library",
        "/Users",
        "/Applications",
        "/private",
        "/Volumes",
    }
)
_SYSTEM_TREES = ("/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/opt", "/sbin", "/usr", "/var/lib")
_SENSITIVE_SYSTEM = ("/etc", "/boot", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/var/spool/cron", "/sys")
_SENSITIVE_HOME = (".ssh", ".gnupg", *HOME_STARTUP)
_DISK = re.compile(
    r"^/dev/(sd[a-z]|hd[a-z]|vd[a-z]|xvd[a-z]|nvme\d|mmcblk\d|disk\d|rdisk\d|md\d|dm-\d|mapper/|loop\d|"
    r"disk/|block/|mem$|kmem$|port$|sr\d|nbd\d|zd\d|bcache\d)"
)
_HARMLESS_DEVICES = re.compile(
    r"^/dev/(null|zero|full|random|urandom|stdout|stderr|stdin|tty|fd/\d+|pts/|shm/)"
)
_ALL_OF_A_FOLDER = re.compile(r"^[*?.\[\]!]+$")


def is_disk(path: str) -> bool:
    return _DISK.match(path) is not None


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def is_broad(path: Path, user_home: Path) -> bool:
    """The root, a system folder, a home, or a folder that holds the user's home."""
    text = str(path)
    home = str(user_home)
    return (
        text in SYSTEM_DIRS
        or text == home
        or _within(home, text)
        or re.fullmatch(r"/(home|Users)/[^/]+", text) is not None
    )


def broad_target(judge: Judge, word: Word) -> str | None:
    """The broad folder a deletion target stands for (`/`, `~/*`, `/[b]in`), or None."""
    text = word.text
    for path in judge.resolve(text):
        if is_broad(path, judge.user_home):
            return str(path)
        # a link in the project towards `/` or the home, named with a slash (`rm -rf dots/`: the link
        # is followed; without one only the link goes)
        real = _real(judge, path) if text.endswith("/") else path
        if real != path and is_broad(real, judge.user_home):
            return f"{path} ({real})"
        if word.pattern:
            for folder in (*SYSTEM_DIRS, str(judge.user_home)):
                if fnmatch.fnmatchcase(folder, str(path).rstrip("/")):
                    return folder
            parent, last = str(path.parent), path.name
            if _ALL_OF_A_FOLDER.match(last) and "*" in last:
                if is_broad(Path(parent), judge.user_home):
                    return parent
                real_parent = _real(judge, Path(parent))
                if is_broad(real_parent, judge.user_home):
                    return f"{parent} ({real_parent})"
    return None


def in_system_tree(path: Path) -> bool:
    return any(_within(str(path), tree) for tree in _SYSTEM_TREES)


@functools.lru_cache(maxsize=8)
def _sensitive_places(user_home: Path) -> tuple[frozenset[str], tuple[str, ...]]:
    """The sensitive paths themselves, and the prefixes of what lies inside them."""
    places = (*_SENSITIVE_SYSTEM, *(str(PurePosixPath(user_home) / name) for name in _SENSITIVE_HOME))
    return frozenset(places), tuple(place + "/" for place in places)


def _sensitive(path: Path, user_home: Path) -> bool:
    text = str(path)
    if re.search(r"/\.git/(config$|hooks(/|$))", text):
        return True  # git runs what they name
    exact, inside = _sensitive_places(user_home)
    return text in exact or text.startswith(inside)


def _shown(text: str) -> str:
    return text if len(text) <= 60 else text[:60] + "…"


#: The places whose content runs by itself later or grants access (a new shell, a login, cron, systemd,
#: git, sudo): a write there asks, through any writer, and a program the judge has no spec for that
#: names one is asked about as if it wrote it.
_RUNS_BY_ITSELF_SYSTEM = (
    "/etc/profile",
    "/etc/profile.d",
    "/etc/bash.bashrc",
    "/etc/zsh",
    "/etc/environment",
    "/etc/crontab",
    "/etc/cron.d",
    "/etc/cron.daily",
    "/etc/cron.hourly",
    "/etc/cron.weekly",
    "/etc/cron.monthly",
    "/var/spool/cron",
    "/etc/systemd",
    "/lib/systemd",
    "/usr/lib/systemd",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ld.so.preload",
    "/etc/ssh",
    "/etc/passwd",
    "/etc/shadow",
    "/etc/pam.d",
)


@functools.lru_cache(maxsize=8)
def _code_places(user_home: Path) -> tuple[str, ...]:
    return (*_RUNS_BY_ITSELF_SYSTEM, *(str(PurePosixPath(user_home) / n) for n in (".ssh", *HOME_STARTUP)))


def runs_by_itself(judge: Judge, path: Path) -> str | None:
    """What `path` is when its content runs by itself later or grants access (through links as well);
    None otherwise."""
    text = str(path)
    for where in dict.fromkeys((text, str(_real(judge, path)))):
        if re.search(r"/\.git/(config$|hooks(/|$))", where):
            return f"{_shown(text)}, which git runs"
        if any(_within(where, place) for place in _code_places(judge.user_home)):
            return f"{_shown(text)}, which runs by itself later or grants access"
    if judge.protected(path) is not None:
        return f"{_shown(text)}, one of mibyan's own files"
    return None


def holds_code_places(judge: Judge, word: Word) -> str | None:
    """The place whose content runs by itself that the folder `word` holds (the home holds ~/.bashrc,
    `/` holds /etc/cron.d), or that it lies in: what an archive unpacks there may land on it."""
    if word.dynamic:
        return f"{_shown(word.text)}, a folder only known when it runs"
    places = (*_code_places(judge.user_home), str(judge.home))
    for path in judge.resolve(word.text):
        text = str(path)
        inner = next((p for p in places if _within(p, text)), None)
        if inner is not None:
            return f"{_shown(text)}, which holds {_shown(inner)}"
        found = runs_by_itself(judge, path)
        if found is not None:
            return found
        if path.name in (".git", "hooks") and ".git" in path.parts:
            return f"{_shown(text)}, which holds git's hooks"
    return None


def judge_path_write(judge: Judge, text: str, action: str) -> Verdict:
    """Judge a write, deletion or change of one static path."""
    if text.startswith("/dev/"):
        if _HARMLESS_DEVICES.match(text):
            return SAFE
        if is_disk(text):
            return Verdict("hardline", f"writes raw data onto a disk ({text})", "disk")
        return Verdict("dangerous", f"{action} a device ({_shown(text)})", "device_write")
    paths = judge.resolve(text)
    if any(ch in text for ch in "*?["):
        for path in list(paths):
            paths.extend(Path(p) for p in glob.glob(str(path))[:200])
    for path in paths:
        reason = judge.protected(path)
        if reason is not None:
            return Verdict(
                "hardline",
                f"{action} mibyan's own files ({_shown(str(path))}), which only you may change",
                "protected",
            )
        if str(path) == "/proc/sysrq-trigger":
            return Verdict(
                "hardline", "can crash or restart the machine at once (/proc/sysrq-trigger)", "power"
            )
    for path in paths:
        # through a link as well: `echo k >> keys/authorized_keys` where keys -> ~/.ssh
        if _sensitive(path, judge.user_home) or _sensitive(_real(judge, path), judge.user_home):
            return Verdict(
                "dangerous", f"{action} a system, start-up or login file ({_shown(text)})", "sensitive_write"
            )
    return SAFE


def _real(judge: Judge, path: Path) -> Path:
    try:
        return judge.real(path)
    except RuntimeError:  # a loop of links: nothing is written through it
        return path


def judge_write_word(judge: Judge, word: Word, action: str, *, cwd_unknown: bool) -> Verdict:
    """Judge a write target word; a target only known at run time is asked about."""
    if word.dynamic:
        for guess in word.guesses:
            verdict = judge_path_write(judge, guess, action)
            if verdict.tier == "hardline":
                return verdict
        return Verdict(
            "dangerous",
            f"{action} a file whose name is only known when it runs ({_shown(word.text)})",
            "dynamic_write",
        )
    verdict = judge_path_write(judge, word.text, action)
    if verdict.tier == "safe" and cwd_unknown and not os.path.isabs(word.text):
        return Verdict(
            "dangerous",
            f"{action} a file in a folder only known when it runs ({_shown(word.text)})",
            "dynamic_write",
        )
    return verdict
