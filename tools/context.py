"""What a running tool may know about the call it serves: the run context a handler is given.

A handler that needs its run (the task, the call id, the stop signal, the judge's policy, the agent of
an agent-level tool) declares a first parameter typed `RunContext`, as pydantic-ai's tools do; the
registry leaves it out of the schema and the executor passes it. A long-running tool (terminal,
web_fetch) waits through `ctx.wait_or_stop`, so an interrupt reaches it at once. Nothing in the tool
layer reads the run from anywhere else.

The executor also makes the context current on the call's thread for the one transport outside the
tool layer that needs the call and is not handed it: an editor's permission question (editors/), which
the approval callback's arguments do not tell which call it is about.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mibyan.core.errors import ToolError
from mibyan.core.interruptible import InterruptSignal
from mibyan.tools.approval import Verdict
from mibyan.tools.judge_policy import JudgePolicy

if TYPE_CHECKING:
    from mibyan.agent.protocol import AgentCore
    from mibyan.tools.sandbox import Sandbox
    from run_agent import AIAgent


class FileAccess(Protocol):
    """Where the file tools read and write text instead of the disk (an editor's open buffers, over ACP).

    The path policy has judged each path before it is handed here: `path` is absolute and resolved.
    `signal` is the tool call's stop signal: set, the wait for the text ends at once.

    Attributes:
        reads: read_text goes through this (else the disk is read).
        writes: write_text goes through this (else the disk is written).
    """

    reads: bool
    writes: bool

    def read_text(self, path: Path, signal: InterruptSignal) -> str:
        """The file's whole text; raises ToolError when it cannot be read."""
        ...

    def write_text(self, path: Path, text: str, signal: InterruptSignal) -> None:
        """Replace the file's text; raises ToolError when it cannot be written."""
        ...


@dataclass(frozen=True)
class RunContext:
    """The call a tool serves: its task, the stop signal, the agent's home (off limits to tools), and the
    sandbox its commands run in (None: unconfined).

    Attributes:
        task_id: the task of the run (hooks and tools that keep per-task state use it).
        signal: set when the run is interrupted: the tool should stop.
        home: the agent's mibyan home; None outside an agent (`handle_function_call`).
        sandbox: where its commands run; None: unconfined.
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
        agent: the agent whose call this is, for the agent-level tools (todo, memory, delegate_task...).
        new_agent: how that agent makes another (a subagent): the factory delegate_task builds its
            children with, called with the keyword arguments of `run_agent.AIAgent`.
        add_usage: counts tokens spent for the call (a subagent's) towards the agent's turn.
    """

    task_id: str | None = None
    signal: InterruptSignal = field(default_factory=InterruptSignal)
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
    agent: AgentCore | None = None
    new_agent: Callable[..., AIAgent] | None = None
    add_usage: Callable[[dict[str, int]], None] = lambda _usage: None

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

    def judge_home(self) -> Path:
        """The home the judges keep tools out of: the agent's, else the one `mibyan_home()` names."""
        if self.home is not None:
            return self.home
        from mibyan.config.paths import mibyan_home

        return mibyan_home()

    def judge_policy(self) -> JudgePolicy:
        """What the command judge judges this call's commands for."""
        home = self.judge_home()
        sandbox = self.sandbox
        # where bubblewrap hides the home from its commands, a folder above the home holds nothing of it
        hidden = sandbox is not None and sandbox.active and sandbox.backend == "bubblewrap"
        hidden = hidden and sandbox is not None and Path(os.path.realpath(home)) in sandbox.hidden
        return JudgePolicy(
            home=home,
            protected=self.protected,
            agent_folder=self.agent_folder,
            writable=self.own_places(),
            home_hidden=hidden,
        )

    def require_agent(self, tool: str) -> AgentCore:
        """The agent of an agent-level tool's call; a ToolError when there is none (a call through
        `model_tools.handle_function_call`, which has no agent's state to read or change)."""
        if self.agent is None:
            raise ToolError(
                f"{tool} works on an agent's session; call it through an agent (run_agent.AIAgent)"
            )
        return self.agent

    def stop_requested(self) -> bool:
        return self.signal.is_set()

    def wait_or_stop(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Wait until `done()`, the timeout, or an interrupt, whichever comes first; whoever makes
        `done()` true calls `waker()`'s function."""
        self.signal.wait_until(done, timeout)

    def waker(self) -> Callable[[], None]:
        """A function that wakes this tool's `wait_or_stop`; hand it to the helper threads the tool starts."""
        return self.signal.notify


_CURRENT: ContextVar[RunContext | None] = ContextVar("mibyan_run_context", default=None)


def current() -> RunContext | None:
    """The call being served on this thread, for the editor's permission question (see above)."""
    return _CURRENT.get()


def bind(context: RunContext) -> object:
    """Make `context` the current one on this thread; returns a token for `unbind`."""
    return _CURRENT.set(context)


def unbind(token: object) -> None:
    _CURRENT.reset(token)  # type: ignore[arg-type]


def stop_requested() -> bool:
    """Whether the call being served on this thread is asked to stop (for the editor's question)."""
    context = _CURRENT.get()
    return context is not None and context.signal.is_set()
