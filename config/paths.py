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
