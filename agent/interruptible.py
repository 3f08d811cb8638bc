"""The interruptible call, under the name DESIGN §1 gives it; it lives on the ground floor.

`mibyan.core.interruptible` is where every module of mibyan imports it from (the tools sit below agent/
and use it too); this name stays for code outside mibyan that used it.
"""

from __future__ import annotations

from mibyan.core.interruptible import *  # noqa: F403
