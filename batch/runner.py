"""The driver: which tasks still need a run, the local pool that runs them, and the one recorder of
their results (the only writer of the run's part files, whatever the backend)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mibyan.batch.execute import AgentConfig, Outcome, Running, run_task
from mibyan.batch.results import FINAL, PartWriter
from mibyan.batch.tasks import Task


@dataclass
class Tally:
    """What this run has done so far, for the progress display and the budget."""

    total: int = 0
    done: int = 0
    by_disposition: dict[str, int] = field(default_factory=dict)
    running: int = 0
    tokens: int = 0


class Recorder:
    """Writes each outcome as it comes (result line first, then its trajectory) and keeps the tally.

    A result without its trajectory (a kill between the two writes) is mended by the next run from the
    stored session; a trajectory is never written for a task that has no result line.
    """

    def __init__(
        self,
        writer: PartWriter,
        tally: Tally,
        *,
        max_tokens: int | None,
        on_result: Callable[[dict[str, Any]], None],
    ) -> None:
        self.writer = writer
        self.tally = tally
        self.max_tokens = max_tokens
        self._on_result = on_result
        self._lock = threading.Lock()

    def started(self) -> None:
        with self._lock:
            self.tally.running += 1

    def record(self, worker: int, outcome: Outcome | None, *, run: int) -> None:
        with self._lock:
            self.tally.running -= 1
        if outcome is None:
            return
        result = {**outcome.result, "run": run, "worker": worker}
        self.writer.write("results", worker, result)
        if outcome.conversations is not None:
            self.writer.write(
                "trajectories",
                worker,
                {
                    "task_id": result["task_id"],
                    "disposition": result["disposition"],
                    "session_id": result["session_id"],
                    "conversations": outcome.conversations,
                },
            )
        with self._lock:
            tally = self.tally
            tally.done += 1
            disposition = str(result["disposition"])
            tally.by_disposition[disposition] = tally.by_disposition.get(disposition, 0) + 1
            tally.tokens += int((result.get("usage") or {}).get("total_tokens", 0))
        self._on_result(result)

    def over_budget(self) -> bool:
        with self._lock:
            return self.max_tokens is not None and self.tally.tokens >= self.max_tokens


def pending(tasks: list[Task], latest: dict[str, dict[str, Any]], *, retry_failed: bool) -> list[Task]:
    """The tasks without a final disposition (with `retry_failed`, the failed ones too)."""
    done = {
        task_id
        for task_id, record in latest.items()
        if record.get("disposition") in FINAL and not (retry_failed and record.get("disposition") == "failed")
    }
    return [task for task in tasks if task.task_id not in done]


@dataclass
class StopSignal:
    """Set once: no task is handed out after it (Ctrl-C, SIGTERM, the token budget)."""

    event: threading.Event = field(default_factory=threading.Event)
    reason: str = ""

    def stop(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()

    def __call__(self) -> bool:
        return self.event.is_set()


def run_local(
    tasks: list[Task],
    config: AgentConfig,
    out: Path,
    *,
    run: int,
    workers: int,
    recorder: Recorder,
    stop: StopSignal,
    running: Running,
    per_provider: int | None = None,
) -> list[threading.Thread]:
    """Start `workers` threads that take the tasks in order until none is left or `stop` is set.

    Returns the threads (the caller waits for them and interrupts what runs on a Ctrl-C).
    """
    from mibyan.agent.providers import ProviderHealth

    health = ProviderHealth()  # a provider failing for one task is skipped by the others too
    slots = None
    if per_provider is not None:
        from mibyan.batch.limits import ProviderSlots

        slots = ProviderSlots(per_provider)
    todo: queue.SimpleQueue[Task] = queue.SimpleQueue()
    for task in tasks:
        todo.put(task)

    def work(worker: int) -> None:
        while not stop():
            if recorder.over_budget():
                stop.stop("the token budget is spent")
                return
            try:
                task = todo.get_nowait()
            except queue.Empty:
                return
            transport = None
            if slots is not None:
                from mibyan.batch.limits import LimitedTransport

                transport = LimitedTransport(slots)
            recorder.started()
            outcome = run_task(
                task,
                config,
                out,
                worker=worker,
                running=running,
                stopping=stop,
                health=health,
                transport=transport,
            )
            recorder.record(worker, outcome, run=run)

    threads = [
        threading.Thread(target=work, args=(number,), name=f"batch-worker-{number}", daemon=True)
        for number in range(min(workers, len(tasks)))
    ]
    for thread in threads:
        thread.start()
    return threads
