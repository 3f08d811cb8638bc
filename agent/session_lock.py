"""Who runs a session right now: an advisory lock (flock) per session, held by the process running it.

A chat, a one-shot or a gateway run holds the lock of its session for as long as it works on it, so
another process does not open the same session meanwhile (and "repair" a tool call still running there
as interrupted). The lock is on a file under the home (`locks/`), keyed by the session's first ancestor,
so a session compressed into a child is still the same session; the kernel drops it when the holder
exits, however it exits, so a crash never leaves a session locked.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from agent_state import SessionStore
from mibyan.config.paths import private_dir
from mibyan.core.errors import MibyanError

if TYPE_CHECKING:
    from run_agent import AIAgent

_Agent = TypeVar("_Agent", bound="AIAgent")


#: Digits a pid is written in (Linux's pid_max is at most 4194304), padded with spaces.
_PID_WIDTH = 10


class SessionBusy(MibyanError):
    """Another process is running the session now."""


def lineage_root(store: SessionStore, session_id: str) -> str:
    """The session `session_id` was compressed from, first of all (itself when it was not)."""
    current, seen = session_id, {session_id}
    while True:
        row = store.sessions.get(current)
        parent = row.get("parent_id") if row is not None else None
        if not parent or row is None or row.get("source") == "subagent" or parent in seen:
            return current
        seen.add(parent)
        current = str(parent)


class SessionLock:
    """The lock of one session in one home; `acquire` raises SessionBusy when another process holds it.

    Args:
        home: the mibyan home.
        session_id: the session (any in its compression lineage names the same lock via `for_session`).
    """

    def __init__(self, home: Path, session_id: str, *, asked: str | None = None) -> None:
        self.session_id = session_id
        self.asked = asked or session_id  # the id the refusal names: the one asked for
        name = hashlib.sha256(session_id.encode()).hexdigest()[:32]  # any id is a safe file name
        self.path = home / "locks" / f"{name}.lock"
        self._fd: int | None = None

    @classmethod
    def for_session(cls, home: Path, store: SessionStore, session_id: str) -> SessionLock:
        return cls(home, lineage_root(store, session_id), asked=session_id)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> SessionLock:
        """Take the lock (a no-op when this object holds it); returns itself.

        Raises:
            SessionBusy: another process holds it; the message names the session and that process.
        """
        if self._fd is not None:
            return self
        private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").partition("\n")[0].strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise SessionBusy(
                f"session {self.asked} is being run by another process right now{who}; "
                "try again when it is done, or start a new session"
            ) from None
        # The holder's pid, for a refusal to name. Written in place at one width (a file that changes
        # size costs the filesystem a block each time: a gateway takes a session's lock per message),
        # and not at all when it says so already (this process held it last).
        mark = f"{os.getpid():<{_PID_WIDTH}}\n".encode()
        written = os.pread(fd, len(mark) + 1, 0)
        if written != mark:
            os.pwrite(fd, mark, 0)
            if len(written) > len(mark):  # a longer file (not of our writing): cut to the mark, once
                os.ftruncate(fd, len(mark))
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the session go (the file stays: removing it would let two processes lock two files; its
        pid is of the last holder, read only while another holds it, who wrote its own on taking it)."""
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def build_holding(home: Path, lock: SessionLock | None, build: Callable[[], _Agent]) -> _Agent:
    """The agent `build` makes, holding its session's lock until it is closed.

    `lock` (that of the session `build` resumes) is taken before `build` opens the session, so the
    repair on open never touches what another process is running; a new session's lock is taken once
    its id is known (nobody else can know it before). A lock this process held already stays held when
    building fails.

    Raises:
        SessionBusy: another process runs the session.
    """
    held_before = lock is not None and lock.held
    if lock is not None:
        lock.acquire()
    try:
        agent = build()
        if lock is None:
            lock = SessionLock(home, agent.session_id).acquire()
    except BaseException:
        if lock is not None and not held_before:
            lock.release()
        raise
    agent.session_lock = lock
    return agent
