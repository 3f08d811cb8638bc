"""What a judgement is: a tier, and for the user a reason with a stable key.

The bottom of the command judge's modules: every one of them, and tools/approval.py above them, speak
of `Verdict`s, so it imports nothing of mibyan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Tier = Literal["safe", "dangerous", "hardline"]


@dataclass(frozen=True)
class Verdict:
    """The judgement of one command: its tier, and for the user a reason with a stable key.

    The reason is a clause that reads after "This command ": "deletes a folder and everything in it (rm -r)".
    `ask_every_time`: the user answers each such call; --yolo and earlier answers never cover it.
    """

    tier: Tier
    reason: str = ""
    key: str = ""
    ask_every_time: bool = False

    @property
    def needs_approval(self) -> bool:
        return self.tier == "dangerous"


SAFE = Verdict("safe")
