"""How mibyan reaches an MCP server: a program it starts (stdio), or a streamable HTTP endpoint.

The HTTP transport is the SDK's. The stdio one is mibyan's own, for what the SDK's does not do: the
server runs in its own session (the terminal's Ctrl-C is for mibyan, not for it) and, on Linux, is sent
SIGTERM by the kernel the moment mibyan's process dies, however it dies; its stderr goes to a log file,
not the terminal, line by line with the server's name and its control characters made visible; a
line on its stdout that is not JSON-RPC is logged and skipped; and stopping it is quick: stdin closed,
a short grace, then SIGTERM and SIGKILL to its whole process group.

Imported on the MCP thread only: it imports the SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

import anyio
from mcp.shared.message import SessionMessage
from mcp_types import jsonrpc_message_adapter
from pydantic import ValidationError

from mibyan.core.sanitize import visible  # the one output sanitiser: the log is read on a terminal
from mibyan.tools.mcp_program import program_path

if TYPE_CHECKING:
    from mibyan.tools.sandbox import Sandbox

log = logging.getLogger("mibyan.mcp")

#: The longest line a server may write (a tool list, a file's content); longer ones are skipped.
LINE_LIMIT = 32 * 1024 * 1024
#: The most of one server's stderr logged per start (a server flooding it cannot fill the disk).
STDERR_LOGGED = 8 * 1024 * 1024
_STDERR_CHUNK = 64 * 1024
#: After its stdin closes, how long a server gets to exit before it is sent SIGTERM, then SIGKILL.
EXIT_GRACE = 1.0

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class StdioCommand:
    """A server program, its arguments, environment and working directory, with `${NAME}`s expanded."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    #: Where it runs confined (its cwd and temp writable), or None: unconfined (`sandbox: off`).
    sandbox: Sandbox | None = None


def _parent_death_signal() -> Callable[[], None] | None:
    """A pre-exec function that has the kernel SIGTERM the child when this process dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request: go now
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent


async def _read_messages(
    name: str,
    stdout: asyncio.StreamReader,
    sink: anyio.abc.ObjectSendStream[Any],
    on_exit: Callable[[], None],
) -> None:
    skipped = 0
    async with sink:
        while True:
            try:
                line = await stdout.readline()
            except ValueError:  # a line past LINE_LIMIT: the reader dropped it
                line = b"(too long)"
            if not line:
                on_exit()
                return
            if not line.strip():
                continue
            try:
                message = jsonrpc_message_adapter.validate_json(line)
            except ValidationError:
                skipped += 1
                if skipped in (1, 100, 10_000):  # the log names it, but is not flooded by it
                    log.warning("MCP server %s wrote %d lines that are not JSON-RPC; skipped", name, skipped)
                continue
            await sink.send(SessionMessage(message))


async def _copy_stderr(name: str, stderr: asyncio.StreamReader, errlog: IO[bytes]) -> None:
    """The server's stderr into the log, each line as `name: text`, escapes shown, not acting on the
    terminal of whoever reads the log (a server could clear it, or retitle it, with a line)."""
    written, pending = 0, b""
    with errlog:
        while True:
            chunk = await stderr.read(_STDERR_CHUNK)
            pending += chunk
            lines = pending.split(b"\n")
            pending = lines.pop() if chunk else b""
            if len(pending) > _STDERR_CHUNK:  # a line without end is logged in pieces
                lines.append(pending)
                pending = b""
            if written <= STDERR_LOGGED:
                entries = [f"{name}: {visible(line.decode('utf-8', 'replace'))}\n" for line in lines if line]
                text = "".join(entries)
                if written + len(text) > STDERR_LOGGED:
                    text = (
                        f"{name}: (the rest of its stderr is not logged: past {STDERR_LOGGED // 2**20} MB)\n"
                    )
                    written = STDERR_LOGGED
                written += len(text)
                with contextlib.suppress(OSError):  # a full disk loses the log, not the server
                    errlog.write(text.encode())
            if not chunk:
                return  # until then it is read on, logged or not, or the server blocks on a full pipe


async def _write_messages(stdin: asyncio.StreamWriter, source: anyio.abc.ObjectReceiveStream[Any]) -> None:
    async with source:
        async for message in source:
            data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
            stdin.write(data.encode("utf-8"))
            await stdin.drain()


async def _exited(process: asyncio.subprocess.Process, within: float) -> bool:
    # returncode, not wait(): wait() also waits for the pipes, which a grandchild may hold open
    deadline = anyio.current_time() + within
    while process.returncode is None:
        if anyio.current_time() >= deadline:
            return False
        await anyio.sleep(0.01)
    return True


async def stop_process(process: asyncio.subprocess.Process, *, grace: float = EXIT_GRACE) -> None:
    """Close the server's stdin, then SIGTERM and SIGKILL its process group, each after `grace`."""
    if process.stdin is not None:
        with contextlib.suppress(OSError, RuntimeError):
            process.stdin.close()
    for sent in (signal.SIGTERM, signal.SIGKILL):
        if await _exited(process, grace):
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sent)  # the server leads its own session: its group has its pid
    if not await _exited(process, EXIT_GRACE):
        log.warning("MCP server process %d did not exit after SIGKILL", process.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # what it started and left behind in its group


def _before_exec(*steps: Callable[[], None] | None) -> Callable[[], None] | None:
    """One pre-exec function running `steps` in order (the parent-death signal, then Landlock)."""
    chosen = [step for step in steps if step is not None]
    if not chosen:
        return None

    def run() -> None:
        for step in chosen:
            step()

    return run


async def _spawn(spec: StdioCommand) -> asyncio.subprocess.Process:
    argv = [spec.command, *spec.args]
    launch = None
    if spec.sandbox is not None:
        # found first, so one that cannot start fails as it would unconfined (not found, not executable),
        # not as a sandbox that started and then could not run it
        program = program_path(spec.command, spec.cwd, spec.env.get("PATH"))
        launch = spec.sandbox.launch([program, *spec.args], cwd=spec.cwd)
    try:
        return await asyncio.create_subprocess_exec(
            *(launch.argv if launch is not None else argv),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(spec.env),
            cwd=spec.cwd,
            start_new_session=True,
            preexec_fn=_before_exec(_parent_death_signal(), launch.preexec if launch is not None else None),
            pass_fds=launch.pass_fds if launch is not None else (),
            limit=LINE_LIMIT,
        )
    finally:
        if launch is not None:
            launch.cleanup()


@contextlib.asynccontextmanager
async def stdio_transport(
    name: str,
    spec: StdioCommand,
    errlog: IO[bytes],
    *,
    on_started: Callable[[int], None],
    on_exit: Callable[[], None],
) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server and yield the SDK's (read stream, write stream) pair; stop it on the way out.

    `errlog` gets the server's stderr (and is closed when that ends, or the server is stopped);
    `on_started` gets the server's pid, `on_exit` is called when its stdout ends (it exited, or is
    about to).

    Raises:
        OSError: the program cannot be started (not found, not executable, no such cwd).
    """
    try:
        with anyio.CancelScope(shield=True):  # a process started must be known, to be stopped
            process = await _spawn(spec)
    except BaseException:
        errlog.close()
        raise
    on_started(process.pid)
    assert process.stdout is not None and process.stdin is not None and process.stderr is not None
    # not in the task group below: what a server says as it stops (a traceback) should reach the log
    copying = asyncio.create_task(_copy_stderr(name, process.stderr, errlog))
    read_send, read_receive = anyio.create_memory_object_stream[Any](0)
    write_send, write_receive = anyio.create_memory_object_stream[Any](0)
    grace = EXIT_GRACE
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(_read_messages, name, process.stdout, read_send, on_exit)
            group.start_soon(_write_messages, process.stdin, write_receive)
            try:
                yield read_receive, write_send
            except anyio.get_cancelled_exc_class():
                grace = 0.1  # given up on (it did not start in time): no time to wind down
                raise
            finally:
                group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await stop_process(process, grace=grace)
            for stream in (read_receive, write_send):
                await stream.aclose()
            # its stderr ends with it, unless something it started holds it open
            await asyncio.wait([copying], timeout=EXIT_GRACE)
            copying.cancel()


@contextlib.asynccontextmanager
async def http_transport(url: str, headers: Mapping[str, str]) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK's streamable HTTP transport, with the configured headers on every request."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(30, read=300)  # a server may hold a response stream open for long
    async with (
        httpx2.AsyncClient(headers=dict(headers), timeout=timeout) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams
