"""Which files the file tools may touch without asking: the one entry point is `judge_path`.

The working directory (the project) and the temp directory are free. Anything else is outside: a read
or a write there is "dangerous" and goes through the same approval flow as a dangerous shell command,
so the user sees the path and the reason. Places that hold secrets (SSH and GPG keys, cloud and
registry credentials, `.env` files of other projects, /etc/shadow) always ask, under a key of their
own, even with --yolo. Writes to mibyan's own files (`tools.protected`) are hardline in every mode;
writes to shell start-up files (and /etc) and inside a `.git` folder ask under keys of their own,
since what they hold runs later by itself (git runs its hooks and some of its config as commands).

Paths are judged by what they lead to: symlinks are resolved first, so a link inside the project that
points at ~/.ssh/id_rsa is judged as ~/.ssh/id_rsa. A working directory that is the filesystem root or
the home folder frees nothing, since it would free the whole machine or every dotfile.

A gateway agent (`agent_folder`) works in its workspace inside the home: that one folder of the home is
free for it, and the rest of the home (other agents, state.db, config.yaml) is hardline even to read, as
are the places of secrets (no one in a channel may approve reading the host's keys). It writes nowhere
but its workspace and its own temp folder (`temp`): not the machine's /tmp, which other agents read.
An isolated agent's tools touch nothing outside its workspace at all.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mibyan.tools.protected import protected_reason, sealed_reason
from mibyan.tools.verdict import SAFE, Verdict

Access = Literal["read", "write"]

#: Under the home folder: what each place holds.
_HOME_SECRETS: dict[str, str] = {
    ".ssh": "SSH keys",
    ".gnupg": "GPG keys",
    ".aws": "AWS credentials",
    ".azure": "Azure credentials",
    ".config/gcloud": "Google Cloud credentials",
    ".config/gh": "GitHub tokens",
    ".kube/config": "Kubernetes credentials",
    ".docker/config.json": "container registry credentials",
    ".netrc": "login passwords",
    ".git-credentials": "git passwords",
    ".pgpass": "database passwords",
    ".npmrc": "npm tokens",
    ".pypirc": "PyPI tokens",
    ".password-store": "passwords",
    ".local/share/keyrings": "passwords",
    ".bash_history": "your shell history, where typed passwords end up",
    ".zsh_history": "your shell history, where typed passwords end up",
    ".psql_history": "database history, where typed passwords end up",
    ".mysql_history": "database history, where typed passwords end up",
}
_SYSTEM_SECRETS: dict[str, str] = {
    "/etc/shadow": "the system's password hashes",
    "/etc/gshadow": "the system's password hashes",
    "/etc/sudoers": "who may act as root",
    "/etc/ssh": "the machine's SSH host keys",
}
_ENV_FILE_NAMES = (".env", ".envrc")
#: Folders no home holds: a "home" holding one of them (`/`) is no place to hide.
_NOT_HOMES = ("/bin", "/etc", "/lib", "/opt", "/sbin", "/tmp", "/usr", "/var")
#: Under the home folder: files and folders whose content runs by itself later (a new shell, a login, git).
#: The command judge asks before a shell command writes them too (tools/command_paths.py): one list.
HOME_STARTUP = (
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".kshrc",
    ".cshrc",
    ".tcshrc",
    ".xprofile",
    ".xinitrc",
    ".pam_environment",
    ".gitconfig",
    ".config/git",
    ".config/fish",
    ".config/autostart",
    ".config/systemd",
    ".config/environment.d",
    ".local/bin",
)


@dataclass(frozen=True)
class PathJudgement:
    """The verdict on one path, with what it resolves to.

    Attributes:
        verdict: safe, dangerous (ask) or hardline (never).
        target: the absolute path with every symlink resolved: what a tool must actually open.
        shown: how the path is shown to the user (`link → target` when a symlink leads elsewhere).
    """

    verdict: Verdict
    target: Path
    shown: str


def _inside(path: Path, folder: Path) -> bool:
    """`path` is `folder` or lies under it (both absolute and normalised); compared as text, since
    `Path.parents` made judging ~20 places per call cost a millisecond."""
    inner, outer = str(path), str(folder)
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _both_forms(path: Path) -> tuple[Path, Path]:
    """The path as written (normalised) and with its symlinks resolved."""
    plain = Path(os.path.normpath(path))
    return plain, Path(os.path.realpath(plain))


@functools.lru_cache(maxsize=8)
def _secret_roots(home: Path) -> tuple[tuple[Path, tuple[Path, Path], str], ...]:
    """Each secret place, in both its forms, with what it holds. Cached per home: resolving ~20 places
    on every judgement made a search over a large tree slow, and the places do not move during a run
    (no tool can create a link in their stead: the file tools write no links, the sandbox no home)."""
    places = [(home / relative, what) for relative, what in _HOME_SECRETS.items()]
    places += [(Path(absolute), what) for absolute, what in _SYSTEM_SECRETS.items()]
    return tuple((place, _both_forms(place), what) for place, what in places)


def secret_places(homes: Iterable[Path]) -> list[Path]:
    """Every place of secrets the judge knows of (folders and files), under each of `homes` and on the
    system: the list the gateway's sandbox masks from commands (tools/sandbox.py), so that what a channel
    may not read by name it cannot read by any other spelling either. `.env` files of other projects,
    which lie anywhere, are not among them."""
    places = [home / relative for home in homes for relative in _HOME_SECRETS]
    return places + [Path(place) for place in _SYSTEM_SECRETS]


def user_homes() -> list[Path]:
    """The homes of the user running mibyan ($HOME, and the one the system's user database names), which
    a gateway hides from its commands; not a folder that holds the system's or the temporary one (a home
    of `/`), which cannot be hidden."""
    candidates = [os.environ.get("HOME", "")]
    with contextlib.suppress(ImportError, KeyError):
        import pwd  # not on Windows

        candidates.append(pwd.getpwuid(os.getuid()).pw_dir)
    held = [Path(p) for p in (*_NOT_HOMES, os.path.realpath(tempfile.gettempdir()))]
    homes = [Path(os.path.realpath(c)) for c in candidates if c]
    return list(dict.fromkeys(h for h in homes if not any(_inside(place, h) for place in held)))


def _secret_place(target: Path, plain: Path, *, cwd: Path) -> str | None:
    """What secret `target` (or the path as written) holds, or None when it is not a secret place."""
    for place, roots, what in _secret_roots(Path.home()):
        if any(_inside(form, root) for form in (target, plain) for root in roots):
            return f"{_tilde(place)}, which holds {what}"
    if target.parts[:2] == ("/", "proc") and target.name in ("environ", "mem"):
        return f"{target}, the memory or environment of a process, which may hold API keys"
    for form in (target, plain):
        if (form.name in _ENV_FILE_NAMES or form.name.startswith(".env.")) and not _inside(form, cwd):
            return f"{form}, the secrets file (.env) of another project"
    return None


def secret_reason(path: Path, *, cwd: Path) -> str | None:
    """What secret the absolute `path` holds (SSH keys, cloud credentials, ...), or None.

    The command judge asks this of a shell command's arguments, so `cat ~/.ssh/id_rsa` asks as
    `read_file` does.
    """
    plain, target = _both_forms(path)
    return _secret_place(target, plain, cwd=cwd)


def may_reach(pattern: Path, place: Path) -> bool:
    """Whether the absolute glob `pattern` (`~/.ss?/id_*`) may name `place` or a path inside it: its first
    parts match those of `place`, one by one, as bash matches them (a `*` never crosses a `/`, nor
    matches a name starting with a dot)."""
    mine, theirs = pattern.parts, place.parts
    if len(mine) < len(theirs):
        return False
    return all(
        fnmatch.fnmatchcase(name, glob) and (glob.startswith(".") or not name.startswith("."))
        for name, glob in zip(theirs, mine[: len(theirs)], strict=True)
    )


def secret_pattern_reason(pattern: Path) -> str | None:
    """What secret a glob pattern may name (`~/.ss?/id_*`, `/proc/*/envir?n`), or None."""
    for place, roots, what in _secret_roots(Path.home()):
        if any(may_reach(pattern, root) for root in roots):
            return f"{_tilde(place)}, which holds {what}"
    last = pattern.name
    if (
        len(pattern.parts) >= 4
        and may_reach(pattern, Path("/proc"))
        and fnmatch.filter(("environ", "mem"), last)
    ):
        return f"{pattern}, the memory or environment of a process, which may hold API keys"
    return None


def _starts_by_itself(target: Path, plain: Path) -> bool:
    home = Path.home()
    roots = [home / name for name in HOME_STARTUP] + [Path("/etc")]
    return any(_inside(form, root) for form in (target, plain) for root in roots)


def _tilde(path: Path) -> str:
    home = Path.home()
    return f"~/{path.relative_to(home)}" if _inside(path, home) and path != home else str(path)


def _free_roots(cwd: Path, own_temp: Path | None) -> list[Path]:
    roots: list[Path] = []
    if cwd not in (Path("/"), Path.home(), Path(os.path.realpath(Path.home()))):
        roots.append(cwd)
    temp = os.environ.get("TMPDIR") or tempfile.gettempdir()
    roots.extend(_both_forms(Path(temp)))
    if own_temp is not None:
        roots.extend(_both_forms(own_temp))
    return roots


def judge_path(
    path: str,
    access: Access,
    *,
    home: Path | None,
    cwd: Path | None = None,
    protected: Iterable[Path] = (),
    agent_folder: Path | None = None,
    isolated: bool = False,
    temp: Path | None = None,
) -> PathJudgement:
    """Judge a file tool's access to `path`.

    Args:
        path: the path as the model gave it (absolute, relative to `cwd`, or starting with `~`).
        access: "read" (read, list, search) or "write" (write, patch).
        home: the agent's mibyan home; writes there are hardline.
        cwd: the working directory; the process's own when omitted.
        protected: more files no tool may write (the modules of the configured hooks).
        agent_folder: a gateway agent's own folder in the home (see the module's docstring).
        isolated: nothing outside `cwd` may be touched.
        temp: a gateway agent's own temp folder: with `cwd`, all it may write.
    """
    where = Path(os.path.realpath(cwd if cwd is not None else Path.cwd()))
    expanded = Path(os.path.expanduser(path))
    plain = Path(os.path.normpath(where / expanded))
    # realpath resolves each link before a following "..", as the OS does; normpath (for `plain`, the
    # path as written) does not, so the two can differ: both are judged
    target = Path(os.path.realpath(where / expanded))
    shown = str(target) if target == plain else f"{path} → {target}"
    confined = _confined(target, plain, access, home, where, agent_folder, isolated)
    confined = confined or _gateway_write(target, plain, access, where, agent_folder, temp)
    verdict = confined or _verdict(target, plain, access, home, where, protected, path, agent_folder, temp)
    if agent_folder is not None and verdict.key.startswith("secret_"):
        # whoever answers in a gateway's channel is not the person whose keys these are
        verdict = Verdict("hardline", verdict.reason, verdict.key)
    return PathJudgement(verdict, target, shown)


def _confined(
    target: Path,
    plain: Path,
    access: Access,
    home: Path | None,
    cwd: Path,
    agent_folder: Path | None,
    isolated: bool,
) -> Verdict | None:
    """The refusal of a gateway agent's access to the home's other parts, or outside an isolated one's
    workspace; None when neither applies."""
    verb = "reads" if access == "read" else "writes"
    if isolated and not all(_inside(form, cwd) for form in (target, plain)):
        return Verdict("hardline", f"{verb} {target}, outside this isolated agent's workspace", "isolated")
    if home is None:
        return None
    for form in (target, plain):
        sealed = sealed_reason(form, home=home, agent_folder=agent_folder, cwd=cwd)
        if sealed is not None:
            return Verdict("hardline", f"{verb} {sealed}", "sealed_home")
    return None


def _gateway_write(
    target: Path, plain: Path, access: Access, cwd: Path, agent_folder: Path | None, temp: Path | None
) -> Verdict | None:
    """The refusal of a gateway agent's write outside its workspace and its own temp folder: whoever
    answers in a channel may not let it write the machine's files, nor leave any where other agents look."""
    if agent_folder is None or access != "write":
        return None
    roots = [cwd, *(_both_forms(temp) if temp is not None else ())]
    if all(any(_inside(form, root) for root in roots) for form in (target, plain)):
        return None
    own = f" and its temp folder ({temp})" if temp is not None else ""
    return Verdict("hardline", f"writes {target}, outside this agent's workspace ({cwd}){own}", "sealed_home")


def _verdict(
    target: Path,
    plain: Path,
    access: Access,
    home: Path | None,
    cwd: Path,
    protected: Iterable[Path],
    given: str,
    agent_folder: Path | None,
    temp: Path | None,
) -> Verdict:
    verb = "reads" if access == "read" else "writes"
    if access == "write" and home is not None:
        own = agent_folder is not None and _inside(cwd, Path(os.path.realpath(agent_folder)))
        writable = [cwd, *([temp] if temp is not None else [])] if own else []
        # both: the file this policy will have the tool open, and the path as the OS would resolve it
        for form in (str(target), given):
            refused = protected_reason(form, home=home, cwd=cwd, extra=protected, writable=writable)
            if refused is not None:
                return Verdict("hardline", refused, "protected_file")
    if home is not None and access == "read" and target == Path(os.path.realpath(home / "config.yaml")):
        return Verdict(
            "dangerous",
            f"{verb} {target}, mibyan's configuration, which may hold API keys",
            "secret_read",
            ask_every_time=True,
        )
    secret = _secret_place(target, plain, cwd=cwd)
    if secret is not None:
        return Verdict("dangerous", f"{verb} {secret}", f"secret_{access}", ask_every_time=True)
    if access == "write" and _starts_by_itself(target, plain):
        return Verdict(
            "dangerous",
            f"writes {target}, which runs by itself when you open a shell or log in",
            "write_startup",
        )
    if access == "write" and ".git" in target.parts:
        return Verdict(
            "dangerous",
            f"writes {target}, inside a .git folder, whose hooks and config run commands when you use git",
            "write_git",
        )
    if any(_inside(target, root) for root in _free_roots(cwd, temp)):
        return SAFE
    return Verdict(
        "dangerous", f"{verb} {target}, outside the working directory ({cwd})", f"{access}_outside"
    )
