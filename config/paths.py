"""Where mibyan keeps its files; standard library only, so start-up paths can use it for free."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from mibyan.core.errors import MibyanError


class HomeError(MibyanError):
    """The mibyan home cannot be created or written."""


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


def _tighten(path: Path, private_mode: int) -> str | None:
    """Make `path` private (`private_mode`) if others may read it; say what was done, or None."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return None
    if not mode & 0o077:
        return None
    try:
        path.chmod(private_mode)
    except OSError:  # not ours to change (another owner): leave it, and claim nothing
        return None
    return f"{path} ({mode:04o} → {private_mode:04o})"


def prepare_home(home: Path) -> list[str]:
    """Make sure the home exists, is private and can be written, before a chat or the gateway writes to it.

    Returns what was made private (a home or database others could read), for the caller to say once.

    Raises:
        HomeError: the home cannot be created or is not writable (a read-only file system, say).
    """
    hint = "make it writable, or point MIBYAN_HOME at a folder you can write"
    try:
        private_dir(home)
    except OSError as exc:
        raise HomeError(f"{home}: cannot create the mibyan home ({exc.strerror or exc}); {hint}") from None
    if not os.access(home, os.W_OK):
        why = "on a read-only file system" if _read_only_file_system(home) else "not writable"
        raise HomeError(f"{home}: the mibyan home is {why}; {hint}")
    logs = [(home / "logs" / name, 0o600) for name in ("mibyan.log", "gateway.log")]
    private = [(home, 0o700), (home / "logs", 0o700), *logs]
    private += [(home / f"state.db{suffix}", 0o600) for suffix in ("", "-wal", "-shm")]
    tightened = [_tighten(path, mode) for path, mode in private]
    return [note for note in tightened if note]


def _read_only_file_system(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
