"""`--backend ray`: the same tasks in Ray actors (extra `mibyan[ray]`); the driver alone writes results.

Each actor runs one task at a time with a fraction of a CPU (an agent run waits on the network), in
threads so that an interrupt reaches the agent it runs. Ray retries nothing (`max_restarts=0`,
`max_task_retries=0`): a task whose actor died has no line and runs again with the next run, by its id.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mibyan.batch.execute import AgentConfig, Outcome, Running, run_task
from mibyan.batch.runner import Recorder, StopSignal
from mibyan.batch.tasks import Task
from mibyan.core.errors import ConfigError

_CPU_PER_ACTOR = 0.25


def check_ray() -> None:
    """Raises ConfigError (one line) where Ray is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--backend ray needs Ray: pip install 'mibyan[ray]' (or use the default --backend local)"
        ) from None


class TaskActor:
    """Runs tasks, one at a time, in a Ray worker process; `interrupt` reaches the one running."""

    def __init__(self, config: AgentConfig, out: str) -> None:
        from mibyan.agent.providers import ProviderHealth

        self.config = config
        self.out = Path(out)
        self.running = Running()
        self.health = ProviderHealth()
        self.stopping = False

    def run(self, task: Task, worker: int) -> Outcome | None:
        return run_task(
            task,
            self.config,
            self.out,
            worker=worker,
            running=self.running,
            stopping=lambda: self.stopping,
            health=self.health,
        )

    def interrupt(self) -> None:
        self.stopping = True
        self.running.interrupt_all()


def run_ray(
    tasks: list[Task],
    config: AgentConfig,
    out: Path,
    *,
    run: int,
    workers: int,
    recorder: Recorder,
    stop: StopSignal,
    address: str | None,
    tick: Callable[[], None],
) -> None:
    """Run `tasks` on `workers` actors of the Ray cluster at `address` (None: a local one)."""
    import signal

    import ray

    ours = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    for sig, handler in ours.items():  # Ray's driver sets handlers of its own: a Ctrl-C stays the batch's
        signal.signal(sig, handler)
    try:
        remote: Any = ray.remote  # its overloads do not list the options of an actor class
        actor_class: Any = remote(
            num_cpus=_CPU_PER_ACTOR, max_concurrency=2, max_restarts=0, max_task_retries=0
        )(TaskActor)
        actors = [actor_class.remote(config, str(out)) for _ in range(min(workers, len(tasks)))]
        _drive(ray, actors, tasks, recorder, stop, run, tick)
    finally:
        ray.shutdown()


def _drive(
    ray: Any,
    actors: list[Any],
    tasks: list[Task],
    recorder: Recorder,
    stop: StopSignal,
    run: int,
    tick: Callable[[], None],
) -> None:
    todo = list(reversed(tasks))
    in_flight: dict[Any, int] = {}
    idle = list(range(len(actors)))
    interrupted = False
    while todo or in_flight:
        if recorder.over_budget():
            stop.stop("the token budget is spent")
        while idle and todo and not stop():
            worker = idle.pop()
            recorder.started()
            in_flight[actors[worker].run.remote(todo.pop(), worker)] = worker
        if stop() and not interrupted and stop.reason == "interrupted":
            interrupted = True
            for actor in actors:
                actor.interrupt.remote()
        if not in_flight:
            break
        ready, rest = ray.wait(list(in_flight), num_returns=1, timeout=0.1)
        if ready and rest:  # and every other one done by now, without waiting for them
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        tick()
        for ref in ready:
            worker = in_flight.pop(ref)
            try:
                outcome = ray.get(ref)
            except ray.exceptions.RayError:
                outcome = None  # the actor died: no line; the task runs again next time
            recorder.record(worker, outcome, run=run)
            idle.append(worker)
