"""The exceptions of mibyan, under the name DESIGN §1 gives them; they live on the ground floor.

`mibyan.core.errors` is where every module of mibyan imports them from (config, the store and the tools
sit below agent/ and may not import it); this name stays for code outside mibyan that used it.
"""

from __future__ import annotations

from mibyan.core.errors import *  # noqa: F403
