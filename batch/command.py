"""`mibyan batch run TASKS.jsonl --out DIR` and `mibyan batch status DIR`.

Ctrl-C (or SIGTERM) stops handing out tasks and interrupts the running agents, whose tasks are recorded
as interrupted (and run again next time); the run then exits 130. A second Ctrl-C leaves at once: the
tasks still running have no line, so they too run again next time, exactly like interrupted ones.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from mibyan.batch.execute import AgentConfig, Running
from mibyan.batch.progress import BatchProgress, say
from mibyan.batch.results import (
    BatchDirError,
    PartWriter,
    check_settings,
    latest_results,
    locked,
    next_run_number,
    read_manifest,
    trajectory_ids,
    write_manifest,
)
from mibyan.batch.runner import Recorder, StopSignal, Tally, pending, run_local
from mibyan.batch.tasks import InvalidLine, Task, read_tasks
from mibyan.core.errors import ConfigError, MibyanError
from mibyan.core.exit_codes import EXIT_BUDGET, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from mibyan.config.loader import AgentSettings


def run_batch(args: argparse.Namespace) -> int:
    """Entry of `mibyan batch`; returns the exit code."""
    try:
        if args.action == "status":
            from mibyan.batch.status import show_status

            return show_status(Path(args.dir), as_json=args.json)
        return _run(args)
    except MibyanError as exc:
        sys.stderr.write(f"mibyan: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:  # before the tasks started (reading the file, resolving the settings)
        sys.stderr.write("\n")
        return EXIT_INTERRUPTED


def agent_config(args: argparse.Namespace, home: Path) -> AgentConfig:
    """The settings every task runs with, resolved once from the flags and the configuration.

    Raises:
        ConfigError: a broken configuration, an unknown toolset or a missing key (before any task runs).
    """
    from mibyan.agent.agent_init import settings_overrides
    from mibyan.agent.options import AgentOptions
    from mibyan.agent.providers import resolve_runtime
    from mibyan.config.loader import load_settings
    from model_tools import check_tool_selection

    toolsets = None
    if args.toolsets:
        toolsets = [name.strip() for name in args.toolsets.split(",") if name.strip()]
        check_tool_selection(toolsets, where="--toolsets")
    overrides = settings_overrides(
        AgentOptions(
            model=args.model, provider=args.provider, max_iterations=args.max_turns, enabled_toolsets=toolsets
        )
    )
    settings = load_settings(home=home, overrides=overrides)
    _warn_if_unconfined(settings, home)
    check_tool_selection(settings.tools.toolsets, allow=settings.tools.allow, deny=settings.tools.deny)
    runtime = resolve_runtime(
        settings,
        provider=settings.model.provider,
        model=settings.model.name,
        base_url=args.base_url,
        api_key=None,
        api_mode=args.api_mode,
        env=os.environ,
        home=home,
    )
    return AgentConfig(
        home=home,
        model=runtime.model,
        provider=runtime.provider,
        api_mode=runtime.api_mode,
        toolsets=list(settings.tools.toolsets),
        max_turns=settings.agent.max_turns,
        yolo=bool(args.yolo),
        base_url=args.base_url,
    )


def _warn_if_unconfined(settings: AgentSettings, home: Path) -> None:
    """Say once, on stderr, when the tasks' commands cannot be confined (as a chat does)."""
    from mibyan.agent.agent_init import make_sandbox
    from mibyan.agent.callbacks import Callbacks

    make_sandbox(settings, home, Callbacks.from_kwargs({}), source="cli")


def recorded_settings(config: AgentConfig) -> dict[str, Any]:
    """The settings a manifest pins: a resume with others is refused."""
    return {
        "model": config.model,
        "provider": config.provider,
        "api_mode": config.api_mode,
        "toolsets": config.toolsets,
        "max_turns": config.max_turns,
        "yolo": config.yolo,
    }


class _Signals:
    """The first Ctrl-C or SIGTERM stops the run gently; a second one leaves at once (see the top)."""

    def __init__(self, stop: StopSignal, running: Running) -> None:
        self.stop = stop
        self.running = running

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.stop.reason == "interrupted":
            sys.stderr.write("\nmibyan batch: stopped at once; the running tasks run again next time\n")
            sys.stderr.flush()
            os._exit(EXIT_INTERRUPTED)
        self.stop.stop("interrupted")
        self.stop.reason = "interrupted"  # a budget stop first, then Ctrl-C: the next one is the second
        self.running.interrupt_all()


def _prepare(args: argparse.Namespace) -> tuple[Path, Path, list[Task], list[InvalidLine], AgentConfig]:
    from mibyan.config.paths import mibyan_home, prepare_home

    tasks_file = Path(args.tasks).expanduser().resolve()
    tasks, invalid = read_tasks(tasks_file, repeat=args.repeat, skip_invalid=args.skip_invalid)
    home = mibyan_home()
    config = agent_config(args, home)
    tightened = prepare_home(home)
    if tightened:
        say(f"made {', '.join(tightened)} private, so only you can read the sessions")
    return tasks_file, home, tasks, invalid, config


def _settle(
    out: Path, home: Path, writer: PartWriter, invalid: list[InvalidLine], latest: dict[str, Any], run: int
) -> None:
    """Before any task: record the invalid lines not recorded yet, and write the trajectories a killed run
    had no time to write (their results are there, their sessions are in the store)."""
    for line in invalid:
        if line.task_id not in latest:
            writer.write(
                "results",
                0,
                {
                    "task_id": line.task_id,
                    "line": line.line,
                    "disposition": "invalid",
                    "error": line.reason,
                    "run": run,
                    "worker": 0,
                },
            )
    have = trajectory_ids(out)
    missing = [
        record
        for task_id, record in latest.items()
        if task_id not in have and record.get("disposition") in ("ok", "failed") and record.get("session_id")
    ]
    if not missing:
        return
    from agent_state import SessionStore
    from mibyan.batch.trajectory import trajectory

    with SessionStore.open(home) as store:
        for record in missing:
            if store.get_session(record["session_id"]) is None:
                continue  # run on another machine (a Ray node): its store is there
            writer.write(
                "trajectories",
                0,
                {
                    "task_id": record["task_id"],
                    "disposition": record["disposition"],
                    "session_id": record["session_id"],
                    "conversations": trajectory(store, record["session_id"]),
                },
            )


def _start_run(
    args: argparse.Namespace, out: Path, tasks_file: Path, config: AgentConfig, count: int
) -> tuple[dict[str, Any], int]:
    manifest = read_manifest(out)
    wanted = recorded_settings(config)
    if manifest is not None:
        check_settings(out, manifest["settings"], wanted)
    run = next_run_number(out, manifest)
    manifest = manifest or {"version": 1, "settings": wanted, "runs": []}
    manifest["tasks_file"] = str(tasks_file)
    manifest["repeat"] = args.repeat
    manifest["base_url"] = config.base_url
    manifest["runs"].append(
        {
            "run": run,
            "started_at": time.time(),
            "backend": args.backend,
            "workers": args.workers,
            "tasks": count,
            "pid": os.getpid(),
        }
    )
    write_manifest(out, manifest)
    return manifest, run


def _run(args: argparse.Namespace) -> int:
    if args.ray_address and args.backend != "ray":
        raise ConfigError("--ray-address joins a Ray cluster: it needs --backend ray")
    tasks_file, home, tasks, invalid, config = _prepare(args)
    if args.backend == "ray":
        from mibyan.batch.ray_backend import check_ray

        check_ray()
    out = Path(args.out).expanduser().resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BatchDirError(f"{out}: cannot make it ({exc.strerror or exc})") from None
    with locked(out):
        manifest, run = _start_run(args, out, tasks_file, config, len(tasks))
        latest = latest_results(out)
        writer = PartWriter(out, run)
        try:
            _settle(out, home, writer, invalid, latest, run)
            todo = pending(tasks, latest, retry_failed=args.retry_failed)
            if not args.quiet:
                say(
                    f"run {run}: {len(todo)} of {len(tasks)} task(s) to run "
                    f"({len(tasks) - len(todo)} done before), "
                    f"{config.provider}/{config.model}, {args.workers} worker(s), results in {out}"
                )
            tally, stop = Tally(total=len(todo)), StopSignal()
            code = _drive(args, out, config, todo, writer, tally, stop, run)
        finally:
            writer.close()
        manifest["runs"][-1].update(
            ended_at=time.time(),
            done=tally.done,
            outcomes=tally.by_disposition,
            tokens=tally.tokens,
            stopped=stop.reason or None,
        )
        write_manifest(out, manifest)
    return code


def _drive(
    args: argparse.Namespace,
    out: Path,
    config: AgentConfig,
    todo: list[Task],
    writer: PartWriter,
    tally: Tally,
    stop: StopSignal,
    run: int,
) -> int:
    progress = BatchProgress(quiet=args.quiet, total=len(todo), tally=tally)
    recorder = Recorder(writer, tally, max_tokens=args.max_tokens, on_result=progress.on_result)
    running = Running()
    handler = _Signals(stop, running)
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if args.backend == "ray":
            from mibyan.batch.ray_backend import run_ray

            run_ray(
                todo,
                config,
                out,
                run=run,
                workers=args.workers,
                recorder=recorder,
                stop=stop,
                address=args.ray_address,
                tick=progress.tick,
            )
        else:
            threads = run_local(
                todo,
                config,
                out,
                run=run,
                workers=args.workers,
                recorder=recorder,
                stop=stop,
                running=running,
                per_provider=args.per_provider,
            )
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.1)
                    progress.tick()
                    if stop.reason == "interrupted":
                        running.interrupt_all()  # an agent that started after the first interrupt
    finally:
        progress.close()
        for sig, old in previous.items():
            signal.signal(sig, old)
    return _summary(args, tally, stop, len(todo))


def _summary(args: argparse.Namespace, tally: Tally, stop: StopSignal, count: int) -> int:
    counts = ", ".join(f"{n} {d}" for d, n in sorted(tally.by_disposition.items())) or "nothing run"
    left = count - tally.done
    if not args.quiet or stop.reason:
        say(f"{counts}; {tally.tokens} tokens" + (f"; {left} left for the next run" if left else ""))
    if stop.reason == "interrupted":
        return EXIT_INTERRUPTED
    if stop.reason:
        say(f"stopped: {stop.reason} (--max-tokens {args.max_tokens})")
        return EXIT_BUDGET
    return EXIT_ERROR if tally.by_disposition.get("failed") else EXIT_OK
