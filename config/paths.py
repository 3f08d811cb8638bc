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
