"""Skills, under the name DESIGN §1 gives them; they live with the tools that read them (tools/skills.py).

`mibyan.tools.skills` is where every module of mibyan imports them from (the skills_list and skill_view
tools sit below agent/ and use them); this name stays for code outside mibyan that used it.
"""

from __future__ import annotations

from mibyan.tools.skills import *  # noqa: F403
