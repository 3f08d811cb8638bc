"""What an MCP server's process starts from, known without the SDK: its inherited environment, and
where its program is as exec would find it (a server whose program is missing fails at once, and a run
whose servers are all missing never imports the SDK)."""

from __future__ import annotations

import errno
import os
import shutil

#: Variables a stdio server gets from mibyan's environment; its `env:` adds to them. Keys stay with mibyan.
INHERITED = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR")


def program_path(command: str, cwd: str | None, path: str | None) -> str:
    """The absolute path `command` runs, looked up on `path` (the server's PATH) unless it names a file.

    Raises:
        OSError: not found (FileNotFoundError), or not executable (PermissionError).
    """
    where = os.path.join(cwd or ".", command) if os.sep in command else None
    found = where if where is not None else shutil.which(command, path=os.defpath if path is None else path)
    if found is None or not os.path.exists(found):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), command)
    return os.path.abspath(found)
