"""One task, start to end: its agent, its working directory, its result line and its trajectory.

The same function runs in the local pool's threads and in Ray's actors; what it returns is plain data
(the driver writes it).
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mibyan.batch.tasks import Task
from mibyan.core.errors import MibyanError

if TYPE_CHECKING:
    from mibyan.agent.providers import ProviderHealth
    from run_agent import AIAgent

log = logging.getLogger("mibyan.batch")

_DISPOSITIONS = {
    "completed": "ok",
    "interrupted": "interrupted",
    "error": "failed",
    "budget_exhausted": "failed",
}
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class AgentConfig:
    """What every task's agent is built with: the settings of the manifest, pinned for all tasks."""

    home: Path
    model: str
    provider: str
    api_mode: str
    toolsets: list[str]
    max_turns: int
    yolo: bool = False
    base_url: str | None = None


@dataclass
class Outcome:
    """A finished task: its result line, and its trajectory when it has one."""

    result: dict[str, Any]
    conversations: list[dict[str, str]] | None = None


@dataclass
class Running:
    """The agents running now, so that a Ctrl-C can interrupt each of them (thread-safe)."""

    _agents: dict[int, AIAgent] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, worker: int, agent: AIAgent) -> None:
        with self._lock:
            self._agents[worker] = agent

    def leave(self, worker: int) -> None:
        with self._lock:
            self._agents.pop(worker, None)

    def interrupt_all(self) -> int:
        with self._lock:
            agents = list(self._agents.values())
        for agent in agents:
            agent.interrupt()
        return len(agents)


def work_folder(out: Path, task_id: str) -> Path:
    """The task's own working directory under DIR/work/ (a name any file system takes)."""
    import hashlib

    safe = _SAFE.sub("_", task_id)[:80].lstrip(".") or "task"
    if safe != task_id:
        safe += "-" + hashlib.sha256(task_id.encode()).hexdigest()[:8]
    return out / "work" / safe


def _fresh_folder(folder: Path) -> Path:
    """An empty folder: a task run again starts where its first attempt started, not amid its leftovers."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def _result(task: Task, started: float, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "task_id": task.task_id,
        "line": task.line,
        "disposition": "failed",
        "final_response": None,
        "session_id": None,
        "usage": {},
        "api_calls": 0,
        "exit_reason": "error",
        "error": None,
        **fields,
    }
    record["seconds"] = round(time.monotonic() - started, 3)
    if task.metadata is not None:
        record["metadata"] = task.metadata
    return record


def build_agent(task: Task, config: AgentConfig, workdir: Path, **extra: Any) -> AIAgent:
    """The task's agent: the batch's settings, its own folder and sandbox, a session of source "batch";
    `extra` are further options (the shared provider health, the transport)."""
    from mibyan.agent.options import AgentOptions
    from run_agent import AIAgent

    options = AgentOptions(
        model=config.model,
        provider=config.provider,
        base_url=config.base_url,
        api_mode=config.api_mode,
        max_iterations=config.max_turns,
        enabled_toolsets=list(config.toolsets),
        home=config.home,
        source="batch",
        yolo=config.yolo,
        workdir=workdir,
        **extra,
    )
    return AIAgent(options=options)


def run_task(
    task: Task,
    config: AgentConfig,
    out: Path,
    *,
    worker: int,
    running: Running,
    stopping: Callable[[], bool],
    health: ProviderHealth | None = None,
    transport: Any = None,
) -> Outcome | None:
    """Run `task` to its end; None when the batch was stopped before its agent started (no line)."""
    started = time.monotonic()
    try:
        workdir = task.cwd or _fresh_folder(work_folder(out, task.task_id))
        agent = build_agent(task, config, workdir, provider_health=health, http_transport=transport)
    except (MibyanError, OSError) as exc:
        return Outcome(_result(task, started, error=f"the agent could not start: {exc}"))
    try:
        running.enter(worker, agent)
        if stopping():
            return None
        return _conversation(agent, task, started)
    finally:
        running.leave(worker)
        agent.close()


def _conversation(agent: AIAgent, task: Task, started: float) -> Outcome:
    from mibyan.batch.trajectory import trajectory

    try:
        result = agent.run_conversation(task.prompt, task_id=task.task_id)
    except MibyanError as exc:  # the store failed mid-run (a locked or full disk): this task failed
        return Outcome(_result(task, started, session_id=agent.session_id, error=str(exc)))
    except Exception as exc:  # one task's bug must not end a thousand others: logged, and failed
        log.exception("task %s failed", task.task_id)
        return Outcome(
            _result(task, started, session_id=agent.session_id, error=f"{type(exc).__name__}: {exc}")
        )
    reason = result["exit_reason"]
    agent.store.sessions.end(result["session_id"], reason)
    error = result["error"]
    if reason == "budget_exhausted":
        error = f"stopped: the budget of {agent.settings.agent.max_turns} model calls is spent"
    disposition = _DISPOSITIONS[reason]
    record = _result(
        task,
        started,
        disposition=disposition,
        final_response=result["final_response"],
        session_id=result["session_id"],
        usage=result["usage"],
        api_calls=result["api_calls"],
        exit_reason=reason,
        error=None if error is None else str(error),
    )
    conversations = None
    if disposition in ("ok", "failed"):
        conversations = trajectory(agent.store, result["session_id"])
    return Outcome(record, conversations)
