"""`--backend ray`: the same tasks in Ray actors (extra `mibyan[ray]`); the driver alone writes results.

Each actor runs one task at a time with a fraction of a CPU (an agent run waits on the network), in
threads so that an interrupt reaches the agent it runs. Ray retries nothing (`max_restarts=0`,
`max_task_retries=0`): a task whose actor died has no line and runs again with the next run, by its id.

Ray queues a task sent to an actor it has not placed, for as long as the actor is not placed: a fixed
quarter of a CPU for 16 actors on a 2-CPU machine left 8 of them unplaced for good, each holding the one
task sent to it (the run stalled at 992/1,000). So an actor's share is cut to what lets all `--workers`
fit on the cluster, and a task goes only to an actor that has answered `ready` (and not to one that died).
"""

from __future__ import annotations

import math
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

    def ready(self) -> bool:
        """Answers once the actor is placed and built: only then is a task sent to it."""
        return True

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


def cpu_per_actor(cluster_cpus: float, actors: int) -> float:
    """A quarter of a CPU, or less where the cluster's CPUs could not hold `actors` quarters.

    Ray counts resources in steps of 1/10,000: the share is rounded down to one, at least one step. A
    cluster with no CPU yet (its workers still to join) gets quarters.
    """
    if cluster_cpus <= 0 or actors <= 0:
        return _CPU_PER_ACTOR
    return min(_CPU_PER_ACTOR, max(1, math.floor(cluster_cpus * 10_000 / actors)) / 10_000)


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
        count = min(workers, len(tasks))
        resources: Any = ray.cluster_resources  # untyped in Ray
        share = cpu_per_actor(float(resources().get("CPU", 0)), count)
        remote: Any = ray.remote  # its overloads do not list the options of an actor class
        actor_class: Any = remote(num_cpus=share, max_concurrency=2, max_restarts=0, max_task_retries=0)(
            TaskActor
        )
        actors = [actor_class.remote(config, str(out)) for _ in range(count)]
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
    starting = {actor.ready.remote(): worker for worker, actor in enumerate(actors)}
    idle: list[int] = []
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
        if not in_flight and (stop() or not starting):
            break  # nothing runs, and nothing will: stopped, or every actor died
        waiting = [*in_flight, *starting]
        ready, rest = ray.wait(waiting, num_returns=1, timeout=0.1)
        if ready and rest:  # and every other one done by now, without waiting for them
            ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        tick()
        for ref in ready:
            if ref in starting:
                _started(ray, ref, starting.pop(ref), idle)
            else:
                _finished(ray, ref, in_flight.pop(ref), idle, recorder, run)


def _started(ray: Any, ref: Any, worker: int, idle: list[int]) -> None:
    try:
        ray.get(ref)
    except ray.exceptions.RayError:
        return  # it could not start: no task goes to it
    idle.append(worker)


def _finished(ray: Any, ref: Any, worker: int, idle: list[int], recorder: Recorder, run: int) -> None:
    try:
        outcome = ray.get(ref)
    except ray.exceptions.RayError:
        recorder.record(worker, None, run=run)  # the actor died: no line; the task runs again next time
        return  # and the dead actor gets no other task
    recorder.record(worker, outcome, run=run)
    idle.append(worker)
