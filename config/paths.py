"""Where mibyan keeps its files; standard library only, so start-up paths can use it for free."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def mibyan_home(env: Mapping[str, str] | None = None) -> Path:
    """The data directory: `$MIBYAN_HOME`, else `~/.mibyan`."""
    env = os.environ if env is None else env
    raw = env.get("MIBYAN_HOME")
    return Path(raw).expanduser() if raw else Path.home() / ".mibyan"


def private_dir(path: Path) -> Path:
    """Create `path` (and any missing parents) so that every folder created is private to the user.

    `Path.mkdir(mode=0o700, parents=True)` gives the mode to the last folder only; the parents it creates
    (the mibyan home, say) would be world-readable.
    """
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically, the file private to the user (0600).

    The temporary file has a random name and is created exclusively beside the target, so a planted file
    or symlink of a guessable name is never written through, and a reader sees the old or the new whole.
    """
    import secrets

    private_dir(path.parent)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
