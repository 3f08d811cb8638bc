"""mibyan's own files, which no tool may change: the model must not be able to loosen its own leash.

The home (`$MIBYAN_HOME`: config.yaml with its approvals and hooks, state.db, memories, skills, trust
records) and a project's `./.mibyan/` folder belong to the user. Tools that write (the file tools, and the
command judge for a shell command's write targets) ask `protected_reason` first; a write it names is
hardline, in every mode.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def _resolved(path: str | os.PathLike[str], cwd: Path) -> Path:
    expanded = Path(os.path.expandvars(os.path.expanduser(os.fspath(path))))
    if not expanded.is_absolute():
        expanded = cwd / expanded
    # resolve() follows symlinks as far as they exist: a link planted towards the home is seen for what it is
    return expanded.resolve(strict=False)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def protected_reason(
    path: str | os.PathLike[str],
    *,
    home: Path,
    cwd: Path | None = None,
    extra: Iterable[Path] = (),
) -> str | None:
    """Why a write to `path` is refused, or None when it is not one of mibyan's own files.

    Args:
        path: the path as the tool received it (relative to `cwd`, `~` and `$VARS` expanded).
        home: the mibyan home of the running agent.
        cwd: the working directory the path is relative to (the process's own when omitted).
        extra: more files to protect, such as the modules the configured hooks live in.
    """
    where = cwd if cwd is not None else Path.cwd()
    target = _resolved(path, where)
    home_dir = _resolved(home, where)
    if _inside(target, home_dir):
        return f"{target} is in mibyan's home ({home_dir}), which only you may change"
    if any(part == ".mibyan" for part in target.parts):
        return (
            f"{target} is in a project's .mibyan folder (mibyan's configuration), which only you may change"
        )
    for file in extra:
        if target == _resolved(file, where):
            return f"{target} holds a hook mibyan runs, which only you may change"
    return None
