"""Replace a file's content so that no reader sees half a file and no planted link is followed.

The new content goes to a temp file beside the target, created with O_EXCL under a random name (a
symlink waiting at a predictable name cannot redirect the write), flushed to disk, given the target's
mode, then renamed over the target. A symlink is not replaced by a regular file: the file it points to
is the one rewritten, and the link stays a link (the caller judges that file before asking for this).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

_ATTEMPTS = 100


def _create_beside(target: Path) -> tuple[int, Path]:
    """Create a fresh, empty temp file in the target's folder; the umask applies to a new file's mode."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_ATTEMPTS):
        candidate = target.with_name(f".{target.name}.{secrets.token_hex(6)}.mibyan-tmp")
        try:
            return os.open(candidate, flags, 0o666), candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temp file beside {target}")


def atomic_write(path: Path, data: bytes) -> Path:
    """Write `data` as the whole new content of `path` (or of the file a symlink at `path` leads to).

    Returns the file actually written. Parent folders are created as needed (0700 is not forced on
    them: they belong to the user's project). The file keeps its permission bits; a new one gets
    0666 less the umask, as `open` would give it.
    """
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        kept: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        kept = None
    fd, temporary = _create_beside(target)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if kept is not None:
                os.fchmod(handle.fileno(), kept)
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _sync_folder(target.parent)
    return target


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable; some file systems cannot open a folder, which is fine."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
