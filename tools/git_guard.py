"""What git, run by an agent's commands, may not take from a repository's own configuration.

A repository's `.git/config` and `.git/hooks/` come with the code, and git runs some of what they hold by
itself: `core.fsmonitor` at every `git status`, hooks at a checkout or a commit, `core.sshCommand` at
a fetch, `core.pager` and `core.askPass` when it pages or needs a password. Unless the user trusts the
project (`mibyan trust`), the terminal tool's commands run with those set in the environment
(`GIT_CONFIG_COUNT`, which git reads after every config file), so that it holds however git is spelled
or wrapped: no fsmonitor, no hooks (`core.hooksPath` of the user's own global config still applies),
`cat` as the pager, the user's own `ssh`. What the environment cannot switch off (an external diff, a
filter or a diff or merge driver, a credential helper, a `!` alias) the judge finds in the repository's
config (`repository_commands`) and asks about (tools/command_git.py).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shlex
import shutil
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path

from mibyan.tools.protected import real_path

#: The keys, of the repository's config, whose commands the judge asks about: the environment cannot
#: switch them off (an empty `diff.external` makes git fail rather than diff).
_RUNS_COMMANDS = re.compile(
    r"^(alias\..+|diff\.external|diff\..+\.(textconv|command)|merge\..+\.driver|"
    r"filter\..+\.(clean|smudge|process)|credential(\..+)?\.helper)$",
    re.IGNORECASE,
)
_USERS_OWN = r"^core\.(hookspath|fsmonitor|sshcommand|askpass)$"


def repository_of(folder: str | os.PathLike[str]) -> tuple[str, str] | None:
    """The work tree holding `folder` and the file of its repository's config, or None outside one.

    The command judge asks this for every git command, so it walks the folders as text, with one
    `stat` each (`Path.is_dir`, `is_file` and the objects made it a third of judging `git status`)."""
    place = os.fspath(folder)
    while True:
        marker = os.path.join(place, ".git")
        kind = _kind(marker)
        if kind == stat.S_IFDIR:
            return place, os.path.join(marker, "config")
        if kind == stat.S_IFREG:
            return _linked(place, marker)
        parent = os.path.dirname(place)
        if parent == place:
            return None
        place = parent


def _linked(place: str, marker: str) -> tuple[str, str] | None:
    """The repository a `.git` file names (`gitdir: ...`: a linked worktree or a submodule)."""
    text = _read(marker).strip()
    if not text.startswith("gitdir:"):
        return None
    gitdir = real_path(os.path.join(place, text.removeprefix("gitdir:").strip()))
    common = os.path.join(gitdir, "commondir")  # a linked worktree: the config lives in the main repository
    if _kind(common) == stat.S_IFREG:
        gitdir = real_path(os.path.join(gitdir, _read(common).strip()))
    return place, os.path.join(gitdir, "config")


#: What `Path.is_dir` and `is_file` take for "nothing there" rather than an error.
_NOTHING_THERE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def _kind(path: str) -> int:
    """The type of the file `path` leads to (`stat.S_IFDIR`, `S_IFREG`, ...), 0 when there is none."""
    try:
        return stat.S_IFMT(os.stat(path).st_mode)
    except OSError as error:
        if error.errno not in _NOTHING_THERE:
            raise
        return 0
    except ValueError:  # a NUL byte in the name
        return 0


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as file:
        return file.read()


def repository_commands(config: str | os.PathLike[str]) -> dict[str, str]:
    """The keys of a repository's config file (its includes too) that make git run a command, with
    their values: `!` aliases, external diffs, filters, drivers and credential helpers."""
    try:
        seen = os.stat(config)
    except OSError:
        return {}
    return dict(_read_commands(os.fspath(config), seen.st_mtime_ns, seen.st_size))


@functools.lru_cache(maxsize=32)
def _read_commands(config: str, _mtime: int, _size: int) -> tuple[tuple[str, str], ...]:
    git = shutil.which("git")
    if git is None:
        return ()
    try:
        done = subprocess.run(
            [git, "config", "--file", config, "--includes", "--null", "--list"],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=10,
            check=False,
            env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull},
        )
    except (OSError, subprocess.SubprocessError):
        return (("config", f"{config} could not be read"),)
    found = []
    for entry in done.stdout.decode("utf-8", "replace").split("\0"):
        key, _, value = entry.partition("\n")
        if not _RUNS_COMMANDS.match(key) or (key.lower().startswith("alias.") and not value.startswith("!")):
            continue
        found.append((key, value))
    return tuple(found)


def neutral_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environment` (the commands' own) so that git runs none of a
    repository's fsmonitor, hooks, pager, ssh command or password prompt: the user's own global
    settings of those stay, and so do the variables the user set."""
    own = _users_settings(_global_config_stamp())
    settings = {
        "core.fsmonitor": own.get("core.fsmonitor", "false"),
        "core.hooksPath": own.get("core.hookspath", os.devnull),
        # core.sshCommand outranks GIT_SSH: a user's GIT_SSH program is kept by naming it here
        "core.sshCommand": own.get("core.sshcommand", shlex.quote(environment.get("GIT_SSH") or "ssh")),
        "core.pager": "cat",
        "core.askPass": own.get("core.askpass", ""),
    }
    try:
        start = int(environment.get("GIT_CONFIG_COUNT", "0"))
    except ValueError:
        start = 0
    added = {"GIT_CONFIG_COUNT": str(start + len(settings))}
    for offset, (key, value) in enumerate(settings.items()):
        added[f"GIT_CONFIG_KEY_{start + offset}"] = key
        added[f"GIT_CONFIG_VALUE_{start + offset}"] = value
    if "GIT_PAGER" not in environment:
        added["GIT_PAGER"] = "cat"  # over `pager.<command>` as well
    return added


def _global_config_stamp() -> tuple[int, ...]:
    stamp: list[int] = []
    home = Path.home()
    for path in (home / ".gitconfig", home / ".config" / "git" / "config", Path("/etc/gitconfig")):
        try:
            stamp.append(path.stat().st_mtime_ns)
        except OSError:
            stamp.append(0)
    return tuple(stamp)


@functools.lru_cache(maxsize=4)
def _users_settings(_stamp: tuple[int, ...]) -> dict[str, str]:
    """The user's own (global and system) values of the keys set here, read once per change."""
    git = shutil.which("git")
    if git is None:
        return {}
    try:
        done = subprocess.run(
            [git, "config", "--null", "--get-regexp", _USERS_OWN],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=10,
            check=False,
            cwd="/",
            env={**os.environ, "GIT_DIR": os.devnull},  # no repository's config, only the user's
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for entry in done.stdout.decode("utf-8", "replace").split("\0"):
        key, _, value = entry.partition("\n")
        if key:
            found[key.lower()] = value
    return found
