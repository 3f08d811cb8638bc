"""The terminal tool: run a shell command in its own process group, with a timeout and capped output."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import threading
import time
from typing import Any, cast

from mibyan.agent.errors import ToolError
from mibyan.tools import context
from mibyan.tools.approval import Verdict, classify_command
from mibyan.tools.registry import tool

_KEEP_BYTES = 512 * 1024  # of output, kept from each end; the middle of a flood is dropped
_KILL_GRACE = 0.5


def terminal_verdict(args: dict[str, Any]) -> Verdict:
    return classify_command(str(args.get("command", "")))


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
def terminal(command: str, timeout: int = 120, workdir: str | None = None) -> str:
    """Run a shell command (bash) and return its output (stdout and stderr together) and exit code.

    The command runs in the working directory unless workdir is given. Commands that could destroy data
    ask the user first. Interactive programs cannot be used: give commands that finish on their own.

    Args:
        command: the shell command line to run.
        timeout: seconds after which the command and everything it started are killed.
        workdir: the directory to run in.
    """
    if workdir and not os.path.isdir(workdir):
        raise ToolError(f"no such directory: {workdir}")
    started = time.monotonic()
    process = subprocess.Popen(
        ["bash", "-c", command],
        cwd=workdir or None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    output = _Output()
    stream = cast(io.BufferedReader, process.stdout)

    wake = context.waker()

    def pump() -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            output.feed(chunk)
        process.wait()
        wake()

    reader = threading.Thread(target=pump, name="mibyan-terminal-output", daemon=True)
    reader.start()
    context.wait_or_stop(lambda: process.returncode is not None, max(1, timeout))
    outcome = None
    if process.returncode is None:
        outcome = "interrupted" if context.stop_requested() else f"timed out after {timeout} s"
        _kill_group(process)
    reader.join(2)
    elapsed = time.monotonic() - started
    text = output.text().rstrip("\n")
    status = (
        f"[{outcome}; the command and its children were killed]"
        if outcome
        else (f"[exit code {process.returncode} · {elapsed:.1f} s]")
    )
    return f"{text}\n{status}" if text else status
