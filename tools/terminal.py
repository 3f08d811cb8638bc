"""The terminal tool: run a shell command in its own process group, with a timeout and capped output.

Commands run in the agent's sandbox (tools/sandbox.py), which the tool executor hands over in the run
context; called without one (`model_tools.handle_function_call`, which runs only commands judged safe)
they run unconfined. One call may ask to run outside the sandbox (`outside_sandbox`): that is a
dangerous call of its own kind, which the user answers every time.

A gateway agent's commands (the run context names an agent folder) run from its workspace, without
the variables that hold the gateway's secrets (API keys, tokens, passwords) or name mibyan's home: the
people it serves are not the person who configured it. It may not run in a part of the home not its
own, nor outside its sandbox. An isolated sandbox starts from an empty environment anyway.

Git runs none of the commands a repository's own config names (fsmonitor, hooks, pager, ssh command)
unless the user trusts the project (tools/git_guard.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, cast

from mibyan.core.errors import ToolError, ToolFailed
from mibyan.tools.approval import Verdict, classify_command, outside_sandbox
from mibyan.tools.context import RunContext
from mibyan.tools.git_guard import neutral_environment, repository_of
from mibyan.tools.registry import tool
from mibyan.tools.sandbox import Launch, Sandbox

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|^MIBYAN_", re.IGNORECASE)
_KEEP_BYTES = 512 * 1024  # of output, kept from each end; the middle of a flood is dropped
_KILL_GRACE = 0.5


def terminal_verdict(args: dict[str, Any], ctx: RunContext) -> Verdict:
    sandbox = ctx.sandbox
    workdir = args.get("workdir")
    # judged in the directory it will run in, so a relative target means the file it will write
    where = _run_directory(ctx, workdir)
    refused = _out_of_reach(ctx, where, escape=bool(args.get("outside_sandbox")))
    if refused is not None:
        return refused
    verdict = classify_command(str(args.get("command", "")), cwd=where, policy=ctx.judge_policy())
    if args.get("outside_sandbox") and verdict.tier != "hardline" and sandbox is not None and sandbox.active:
        return outside_sandbox(verdict)
    return verdict


def _run_directory(ctx: RunContext, workdir: object) -> Path:
    # the sandbox is rooted at the agent's working directory (a gateway agent's workspace, say): run there
    base = ctx.sandbox.workdir if ctx.sandbox is not None else ctx.working_directory()
    return base / Path(str(workdir)).expanduser() if workdir else base


def _out_of_reach(current: RunContext, where: Path, *, escape: bool) -> Verdict | None:
    """What a gateway agent's command may not do: run outside its sandbox (whoever answers in the channel
    is not the person who set the gateway up), or in a part of the home not its own, or for an isolated
    agent anywhere outside its workspace."""
    from mibyan.tools.protected import sealed_reason

    if current.home is None:
        return None
    if escape and current.agent_folder is not None:
        return Verdict(
            "hardline", "runs outside the sandbox, which a gateway agent never does", "sealed_home"
        )
    if current.isolated and not where.resolve().is_relative_to(current.working_directory()):
        return Verdict("hardline", f"runs in {where}, outside this isolated agent's workspace", "isolated")
    sealed = sealed_reason(where, home=current.home, agent_folder=current.agent_folder)
    return Verdict("hardline", f"runs in {sealed}", "sealed_home") if sealed is not None else None


def _environment(current: RunContext, cwd: str) -> dict[str, str]:
    """The commands' environment: the process's own, but a gateway agent's lacks the secrets in it, and
    git takes no command from a repository the user has not trusted (tools/git_guard.py)."""
    if current.agent_folder is None:
        kept = dict(os.environ)
    else:
        kept = {name: value for name, value in os.environ.items() if not _SECRET_NAME.search(name)}
        if current.sandbox is not None and current.sandbox.temp is not None:
            kept["TMPDIR"] = str(current.sandbox.temp)  # its own, not the machine's /tmp shared with others
    if not _trusted_repository(current, Path(cwd)):
        kept.update(neutral_environment(kept))
    return kept


def _trusted_repository(current: RunContext, cwd: Path) -> bool:
    """Whether the repository a command starts in is one the user trusts (never a gateway agent's)."""
    from mibyan.config.trust import folder_trusted

    if current.home is None or current.agent_folder is not None:
        return False
    found = repository_of(cwd)
    return found is not None and folder_trusted(current.home, Path(found[0]))


class _Output:
    """Collects a process's output, keeping the head and the tail when it floods."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = _KEEP_BYTES - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > _KEEP_BYTES:
                cut = len(self.tail) - _KEEP_BYTES
                del self.tail[:cut]
                self.dropped += cut

    def text(self) -> str:
        middle = f"\n[... {self.dropped} bytes of output dropped ...]\n" if self.dropped else ""
        return bytes(self.head).decode(errors="replace") + middle + bytes(self.tail).decode(errors="replace")


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            process.wait(_KILL_GRACE)
            return
        except subprocess.TimeoutExpired:
            continue


@tool(toolset="core", dangerous=terminal_verdict, max_result_chars=30_000, timeout=None)
def terminal(
    ctx: RunContext,
    command: str,
    timeout: int = 120,
    workdir: str | None = None,
    outside_sandbox: bool = False,
) -> str:
    """Run a shell command (bash) and return its output (stdout and stderr together) and exit code.

    The command runs in the working directory unless workdir is given, inside a sandbox: by default it
    may write only in the working directory and the temporary directory. Commands that could destroy data
    ask the user first. Interactive programs cannot be used: give commands that finish on their own.

    Args:
        command: the shell command line to run.
        timeout: seconds after which the command and everything it started are killed.
        workdir: the directory to run in.
        outside_sandbox: run this one command outside the sandbox. The user is asked every time; use it
            only after the sandbox blocked a command that really must write elsewhere or use the network.
    """
    cwd = _run_directory(ctx, workdir)
    if not cwd.is_dir():
        raise ToolError(f"no such directory: {workdir}")
    _judge_again(ctx, command, workdir, outside_sandbox)
    sandbox = None if outside_sandbox else ctx.sandbox
    started = time.monotonic()
    process = _start(ctx, ["bash", "-c", command], sandbox, str(cwd))
    output = _Output()
    stream = cast(io.BufferedReader, process.stdout)

    wake = ctx.waker()

    def pump() -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            output.feed(chunk)
        process.wait()
        wake()

    reader = threading.Thread(target=pump, name="mibyan-terminal-output", daemon=True)
    reader.start()
    ctx.wait_or_stop(lambda: process.returncode is not None, max(1, timeout))
    outcome = None
    if process.returncode is None:
        outcome = "interrupted" if ctx.stop_requested() else f"timed out after {timeout} s"
        _kill_group(process)
    reader.join(2)
    elapsed = time.monotonic() - started
    text = output.text().rstrip("\n")
    status = (
        f"[{outcome}; the command and its children were killed]"
        if outcome
        else (f"[exit code {process.returncode} · {elapsed:.1f} s]")
    )
    note = sandbox.explain(text, process.returncode) if sandbox is not None and not outcome else None
    if note:
        status += "\n" + note
    result = f"{text}\n{status}" if text else status
    # stopped (the timeout, a signal: bash reports its child's as 128 + N) or refused by the sandbox:
    # a failed call, shown and counted as one, though the text is the same
    if outcome or note or process.returncode < 0 or process.returncode > 128:
        raise ToolFailed(result)
    return result


def _judge_again(bound: RunContext, command: str, workdir: str | None, outside_sandbox: bool) -> None:
    """Judge the command again just before it starts: a script it runs may have changed on disk while
    the user was asked (or while another call of the same reply ran), and what was allowed is the
    command as it was judged, not whatever the file holds now."""
    if bound.approved is None:
        return
    args = {"command": command, "workdir": workdir, "outside_sandbox": outside_sandbox}
    now = terminal_verdict(args, bound)
    if now.tier == "hardline":
        raise ToolError(f"blocked: {now.reason}; mibyan never runs this")
    if now.tier == "dangerous" and now != bound.approved:
        raise ToolError(
            f"not run: what it runs changed after it was judged (it now {now.reason}), "
            "and the user did not approve that"
        )


def _start(ctx: RunContext, argv: list[str], sandbox: Sandbox | None, cwd: str) -> subprocess.Popen[bytes]:
    """Start `argv` in its own session (so the whole group can be killed), confined by `sandbox`."""
    environment = _environment(ctx, cwd)
    if sandbox is not None and sandbox.isolated and sandbox.active:
        # an isolated sandbox starts from an empty environment: git's settings go in through `env`
        argv = ["env", *(f"{k}={v}" for k, v in neutral_environment({}).items()), *argv]
    launch = sandbox.launch(argv, cwd=cwd) if sandbox is not None else Launch(argv)
    try:
        return subprocess.Popen(
            launch.argv,
            cwd=cwd,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=launch.preexec,
            pass_fds=launch.pass_fds,
        )
    finally:
        launch.cleanup()
