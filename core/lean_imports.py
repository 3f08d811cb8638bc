"""Optional extras of the libraries mibyan uses that mibyan itself never uses, kept out of its processes.

When installed, the model SDKs import aiohttp (for an async client mibyan never makes) and the HTTP
transport imports h2 (HTTP/2, which mibyan never turns on). They came with other extras (the Matrix
connector needs aiohttp) and cost every start 0.1 s and 11 MiB. The `mibyan` program leaves them out at
its start, while it runs one thread; whatever needs one takes it back first (`take_back`), and so imports
it as usual. A library user's process is left as it is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

UNUSED = ("aiohttp", "h2")


def leave_out_unused() -> None:
    """From now on an `import` of an UNUSED extra fails (libraries that find it missing do without it),
    until it is taken back. Extras imported already stay."""
    for name in UNUSED:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]  # the import system's "not importable"


def take_back(names: Iterable[str]) -> None:
    """Let `names` be imported again (a connector whose library needs them)."""
    for name in names:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
