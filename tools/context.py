"""What a running tool may know about the call it serves: its task, and whether it should stop.

The executor sets the context on the worker thread before calling a handler; a long-running tool
(terminal, web_fetch) waits through `wait_or_stop` so an interrupt reaches it at once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mibyan.core.interruptible import InterruptSignal
from mibyan.tools.approval import Verdict

if TYPE_CHECKING:
    from mibyan.tools.sandbox import Sandbox


class FileAccess(Protocol):
    """Where the file tools read and write text instead of the disk (an editor's open buffers, over ACP).

    The path policy has judged each path before it is handed here: `path` is absolute and resolved.

    Attributes:
        reads: read_text goes through this (else the disk is read).
        writes: write_text goes through this (else the disk is written).
    """

    reads: bool
    writes: bool

    def read_text(self, path: Path) -> str:
        """The file's whole text; raises ToolError when it cannot be read."""
        ...

    def write_text(self, path: Path, text: str) -> None:
        """Replace the file's text; raises ToolError when it cannot be written."""
        ...


@dataclass(frozen=True)
class ToolContext:
    """The call a tool serves: its task, the stop signal, the agent's home (off limits to tools), and the
    sandbox its commands run in (None: unconfined).

    Attributes:
        protected: more files no tool may write (the modules of the configured hooks).
        allow_private_web: web_fetch may reach loopback and private addresses (`web.allow_private`).
        approved: the verdict the user (or --yolo) allowed for this call; a tool that judges again at
            the moment it acts (the file tools) goes on only when nothing changed in between.
        workdir: the working directory of relative paths and commands (a gateway agent's workspace);
            the process's own when None.
        agent_folder: a gateway agent's own folder in the home: the one part of the home its tools may
            read, and its workspace (`workdir`, inside it) and its temp folder the parts they may write.
            Other agents' folders, state.db and config.yaml are out of their reach.
        isolated: the agent is isolated in its workspace: its tools may not touch anything outside it.
        call_id: the id of the model's tool call this is.
        files: where read_file, write_file and patch read and write text, when not the disk.
    """

    task_id: str | None
    signal: InterruptSignal
    home: Path | None = None
    sandbox: Sandbox | None = None
    protected: tuple[Path, ...] = ()
    allow_private_web: bool = False
    approved: Verdict | None = None
    workdir: Path | None = None
    agent_folder: Path | None = None
    isolated: bool = False
    call_id: str | None = None
    files: FileAccess | None = None

    def working_directory(self) -> Path:
        """Where relative paths lead and commands run."""
        return self.workdir if self.workdir is not None else Path.cwd()

    def own_places(self) -> tuple[Path, ...]:
        """The folders of the home a gateway agent's tools may write: its workspace and its own temp
        folder (none for an agent that is not a gateway's)."""
        if self.agent_folder is None:
            return ()
        temp = self.sandbox.temp if self.sandbox is not None else None
        return (self.working_directory(), *([temp] if temp is not None else []))


_CURRENT: ContextVar[ToolContext | None] = ContextVar("mibyan_tool_context", default=None)


def current() -> ToolContext | None:
    return _CURRENT.get()


def bind(context: ToolContext) -> object:
    """Make `context` the current one on this thread; returns a token for `unbind`."""
    return _CURRENT.set(context)


def unbind(token: object) -> None:
    _CURRENT.reset(token)  # type: ignore[arg-type]


def stop_requested() -> bool:
    context = _CURRENT.get()
    return context is not None and context.signal.is_set()


def wait_or_stop(done: Callable[[], bool], timeout: float | None) -> None:
    """Wait until `done()`, the timeout, or an interrupt, whichever comes first."""
    context = _CURRENT.get()
    if context is None:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while not done() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.02)
        return
    context.signal.wait_until(done, timeout)


def waker() -> Callable[[], None]:
    """A function that wakes this tool's `wait_or_stop`; hand it to the helper threads the tool starts
    (they do not inherit the tool's context)."""
    context = _CURRENT.get()
    return context.signal.notify if context is not None else (lambda: None)
