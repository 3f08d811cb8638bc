"""mibyan's own files, which no tool may change: the model must not be able to loosen its own leash.

The home (`$MIBYAN_HOME`: config.yaml with its approvals and hooks, state.db, memories, skills, trust
records) and a project's `./.mibyan/` folder belong to the user. Tools that write (the file tools, and the
command judge for a shell command's write targets) ask `protected_reason` first; a write it names is
hardline, in every mode.

A gateway agent's tools reach even less of the home: its own folder (`agents/<id>/`) is all they may
read there (`sealed_reason`), and its workspace and its own `tmp/` all they may write, so one agent
never sees another's memory, files or conversations. The home's own name is not a project's `.mibyan/`:
under the default home, `~/.mibyan`, a gateway agent's workspace is as much its own as under any other.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable
from pathlib import Path


def real_path(path: str) -> str:
    """`path` with its links followed as far as they exist, as `Path.resolve()` does it (a loop of links
    raises RuntimeError), in text: the command judge resolves each path a command writes, and the
    objects cost more than following the links."""
    with contextlib.suppress(OSError):  # most paths exist: then it holds no loop, and no stat tells so
        return os.path.realpath(path, strict=True)
    real = os.path.realpath(path)
    try:
        os.stat(real)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise RuntimeError(f"Symlink loop from {real!r}") from error
    return real


def _inside(path: str, folder: str) -> bool:
    """`path` is `folder` or lies under it (both resolved)."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


class OwnFiles:
    """mibyan's own places for one run (its home, the hook modules, a gateway agent's folders), asked about
    many paths: `protected` and `sealed` answer as `protected_reason` and `sealed_reason` do, resolving
    each place and path once. The command judge makes one per judgement, since what the links on disk
    lead to may change between two judgements.

    Args:
        home: the mibyan home of the running agent.
        extra: more files to protect, such as the modules the configured hooks live in.
        writable: the folders inside the home tools may write (a gateway agent's workspace and its own
            temp folder).
        agent_folder: a gateway agent's own folder in the home; None (not a gateway agent) seals nothing.
    """

    def __init__(
        self,
        *,
        home: Path,
        extra: Iterable[Path] = (),
        writable: Iterable[Path] = (),
        agent_folder: Path | None = None,
    ) -> None:
        self._home = home
        self._extra = tuple(extra)
        self._writable = tuple(writable)
        self._agent_folder = agent_folder
        self._seen: dict[tuple[str, str | None], str] = {}
        self._folders: dict[str, str] = {}

    def _resolved(self, path: str | os.PathLike[str], cwd: str | os.PathLike[str]) -> str:
        """`path` (relative to `cwd`, `~` and `$VARS` expanded) with its links followed as far as they
        exist: a link planted towards the home is seen for what it is."""
        text = os.path.expandvars(os.path.expanduser(os.fspath(path)))
        key: tuple[str, str | None]
        if text.startswith("/"):  # an absolute path means the same from anywhere
            key = (text, None)
        else:
            key = (text, os.fspath(cwd))
            text = os.path.join(cwd, text)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = self._real(text)
        return found

    def _real(self, path: str) -> str:
        """`real_path(path)`, with the real path of its folder kept: the paths of one command line lie
        in a few folders, and following each of a folder's links again cost most of judging a write."""
        folder, name = os.path.split(path)
        if name in ("", ".", ".."):
            return real_path(path)
        base = self._folders.get(folder)
        if base is None:
            base = self._folders[folder] = real_path(folder)
        inside = os.path.join(base, name)
        # a name that is no link ends where its folder does (and a loop of links there has been refused)
        return real_path(path) if os.path.islink(inside) else inside

    def real(self, path: str | os.PathLike[str], *, cwd: str | os.PathLike[str]) -> str:
        """`path` (relative to `cwd`) with its links followed as far as they exist."""
        return self._resolved(path, cwd)

    def protected(self, path: str | os.PathLike[str], *, cwd: str | os.PathLike[str]) -> str | None:
        """Why a write to `path` is refused, or None when it is not one of mibyan's own files."""
        target = self._resolved(path, cwd)
        home_dir = self._resolved(self._home, cwd)
        inner = target
        if _inside(target, home_dir):
            if not any(_inside(target, self._resolved(folder, cwd)) for folder in self._writable):
                return f"{target} is in mibyan's home ({home_dir}), which only you may change"
            # the home's own name is not a project's folder: the default home is `~/.mibyan`, and a
            # gateway agent's workspace inside it is still its own (a `.mibyan/` made inside that
            # workspace is not)
            inner = target[len(home_dir.rstrip("/")) + 1 :]
        if ".mibyan" in inner.split("/"):
            what = "a project's .mibyan folder (mibyan's configuration)"
            return f"{target} is in {what}, which only you may change"
        for file in self._extra:
            if target == self._resolved(file, cwd):
                return f"{target} holds a hook mibyan runs, which only you may change"
        return None

    def sealed(self, path: str | os.PathLike[str], *, cwd: str | os.PathLike[str]) -> str | None:
        """Why a gateway agent's tool may not even read `path`: a part of the home not its own, or None."""
        if self._agent_folder is None:
            return None
        target = self._resolved(path, cwd)
        home_dir = self._resolved(self._home, cwd)
        if _inside(target, home_dir) and not _inside(target, self._resolved(self._agent_folder, cwd)):
            # read after a verb ("reads ...", "runs in ..."), so it is a noun phrase
            return (
                f"{target}, which is in mibyan's home ({home_dir}) but not this agent's: other agents' "
                "files and conversations"
            )
        return None


def protected_reason(
    path: str | os.PathLike[str],
    *,
    home: Path,
    cwd: Path | None = None,
    extra: Iterable[Path] = (),
    writable: Iterable[Path] = (),
) -> str | None:
    """Why a write to `path` is refused, or None when it is not one of mibyan's own files.

    Args:
        path: the path as the tool received it (relative to `cwd`, `~` and `$VARS` expanded).
        home: the mibyan home of the running agent.
        cwd: the working directory the path is relative to (the process's own when omitted).
        extra: more files to protect, such as the modules the configured hooks live in.
        writable: the folders inside the home tools may write (a gateway agent's workspace and its own
            temp folder).
    """
    where = cwd if cwd is not None else Path.cwd()
    return OwnFiles(home=home, extra=extra, writable=writable).protected(path, cwd=where)


def sealed_reason(
    path: str | os.PathLike[str], *, home: Path, agent_folder: Path | None, cwd: Path | None = None
) -> str | None:
    """Why a gateway agent's tool may not even read `path`: a part of the home not its own, or None.

    Args:
        path: the path as the tool received it (relative to `cwd`).
        home: the mibyan home (other agents' folders, state.db, config.yaml, logs).
        agent_folder: the agent's own folder in the home; None (not a gateway agent) seals nothing.
        cwd: the working directory the path is relative to (the process's own when omitted).
    """
    if agent_folder is None:
        return None
    where = cwd if cwd is not None else Path.cwd()
    return OwnFiles(home=home, agent_folder=agent_folder).sealed(path, cwd=where)
