"""What the command judge is told about the run it judges for: one frozen value, passed in.

The judge reads nothing ambient: the same command with the same `JudgePolicy` gets the same verdict on
any thread. A tool builds the policy from its run context (`RunContext.judge_policy`); a caller with no
run (the CLI's own checks, `model_tools.handle_function_call`) judges as the user at their terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JudgePolicy:
    """The places and the kind of agent a command is judged for.

    Attributes:
        home: the mibyan home, whose files no command may change.
        protected: more files no command may write (the modules of the configured hooks).
        agent_folder: a gateway agent's own folder in the home: the one part of the home its commands
            may name; None for an agent that is not a gateway's.
        writable: the folders of the home a gateway agent's commands may write (its workspace and its
            own temp folder).
        home_hidden: the sandbox hides the home from the commands (bubblewrap), so a folder above the
            home holds nothing of it.
    """

    home: Path
    protected: tuple[Path, ...] = ()
    agent_folder: Path | None = None
    writable: tuple[Path, ...] = ()
    home_hidden: bool = False

    @property
    def gateway(self) -> bool:
        """The commands are a gateway agent's: what a channel may approve is narrower."""
        return self.agent_folder is not None
