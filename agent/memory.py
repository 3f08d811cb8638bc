"""Persistent memory: MEMORY.md (the agent's notes) and USER.md (what it knows of the user).

Both live in `$MIBYAN_HOME/memories/` with hard character limits. Changes are add, replace and remove by
a unique substring; a change that would pass the limit is refused with how much must be cut (never a
silent drop). Writes are atomic and made under an exclusive file lock, so two agents writing at once
cannot push a file past its limit. Content that looks like a secret is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from agent_state import mask_secrets
from mibyan.config.paths import private_dir
from mibyan.core.errors import ToolError

LIMITS = {"memory": 2200, "user": 1375}
FILES = {"memory": "MEMORY.md", "user": "USER.md"}
_ENTRY_SEPARATOR = "\n"


#: Why a gateway channel's memory tool may not change MEMORY.md.
SHARED_NOTES = (
    "MEMORY.md holds the agent's notes, shared by all its channels, and only its owner changes it; "
    "keep what this user tells you with target user, or with remember"
)


#: Why a gateway conversation without a channel keeps nothing of its user.
NOT_KEPT = (
    "this conversation has no channel, so nothing of it is kept for later: answer from what it says "
    "(the client sends X-Mibyan-Channel or `user` to be remembered)"
)


class MemoryStore:
    """The two memory files of one mibyan home (in `memories/`), or of one agent's workspace (`folder`).

    With `channel` (a gateway channel's own folder), what is learnt of the user is the channel's: its
    USER.md and its facts live there, and no other channel reads them; the agent's MEMORY.md is still
    read from `folder`, but it is its owner's to write, not a channel's.
    """

    def check_keeps(self) -> None:
        """Raise ToolError when this memory keeps nothing (see `keeps`)."""
        if not self.keeps:
            raise ToolError(NOT_KEPT)

    def __init__(
        self, home: Path, *, folder: Path | None = None, channel: Path | None = None, keeps: bool = True
    ) -> None:
        self.folder = folder if folder is not None else home / "memories"
        self.channel = channel
        #: False: nothing may be written (a one-off gateway conversation, which nobody can come back to)
        self.keeps = keeps
        #: whose facts in the store are this memory's: None for the home, the workspace for an agent's,
        #: a channel's folder for a gateway channel's
        owner = channel if channel is not None else folder
        self.fact_owner = str(owner) if owner is not None else None

    def path(self, target: str) -> Path:
        if target not in FILES:
            raise ToolError(f"target must be one of {', '.join(FILES)}")
        if target == "user" and self.channel is not None:
            return self.channel / FILES[target]
        return self.folder / FILES[target]

    def read(self, target: str) -> str:
        try:
            return self.path(target).read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    def snapshot(self) -> str:
        """Both files as they are now, for the system prompt (empty when there is no memory yet)."""
        parts = []
        for target, title in (("memory", "Your notes (MEMORY.md)"), ("user", "About the user (USER.md)")):
            text = self.read(target).strip()
            if text:
                parts.append(f"## {title}\n{text}")
        return "\n\n".join(parts)

    @contextlib.contextmanager
    def _locked(self, folder: Path) -> Iterator[None]:
        private_dir(folder)
        fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _write(self, target: str, text: str) -> None:
        path = self.path(target)
        temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temporary, path)

    def change(self, target: str, action: str, content: str = "", old: str = "") -> str:
        """Apply add / replace / remove to one file; returns a short confirmation for the model."""
        self.check_keeps()
        if target == "memory" and self.channel is not None:
            raise ToolError(SHARED_NOTES)
        if content and mask_secrets(content) != content:
            raise ToolError("that looks like a secret (a key or token); secrets are never written to memory")
        with self._locked(self.path(target).parent):
            current = self.read(target)
            if action == "add":
                if not content.strip():
                    raise ToolError("add needs content")
                updated = (
                    (current.rstrip("\n") + _ENTRY_SEPARATOR if current.strip() else "")
                    + content.strip()
                    + "\n"
                )
            elif action in ("replace", "remove"):
                count = current.count(old) if old else 0
                if count != 1:
                    where = "is not in" if count == 0 else f"appears {count} times in"
                    raise ToolError(f"the text to {action} {where} {FILES[target]}; give a unique part of it")
                updated = current.replace(old, content.strip() if action == "replace" else "", 1)
                updated = "\n".join(line for line in updated.splitlines() if line.strip()) + "\n"
            else:
                raise ToolError("action must be add, replace or remove")
            limit = LIMITS[target]
            if len(updated) > limit:
                raise ToolError(
                    f"{FILES[target]} would hold {len(updated)} characters, over its limit of {limit}: "
                    f"cut at least {len(updated) - limit} characters (replace or remove older entries)"
                )
            self._write(target, updated if updated.strip() else "")
        return f"{FILES[target]} updated ({len(updated)}/{limit} characters)"
