"""The connections to an agent's MCP servers: started at once, in the background, stopped by close().

The agent is synchronous, the SDK is asyncio: the connections live on one thread running an event loop,
and tool calls (on the executor's threads) hand coroutines to it and wait for them, interruptibly. That
thread imports the SDK (about half a second), so neither the import nor the servers' start-up sits on
the first request's path: each server's tool list is cached in the home, keyed by a hash of the
server's configuration, and offered from there at once; a call waits for its server to be up, at most
until `mcp.start_timeout` after the start. A server that cannot start is reported once and left out.

Subagents use their parent's connections (`McpConnections` is shared, and closed by its owner only).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from mibyan.config.mcp import McpServerSettings
from mibyan.config.paths import private_dir
from mibyan.core.errors import ToolError
from mibyan.tools.mcp_cache import Listing, McpTool, ToolCache
from mibyan.tools.mcp_program import INHERITED, program_path

if TYPE_CHECKING:
    from mibyan.core.interruptible import InterruptSignal
    from mibyan.tools.sandbox import Sandbox

log = logging.getLogger("mibyan.mcp")

Status = Literal["starting", "ready", "failed", "stopped"]
#: How long close() waits for the servers to stop (each gets its stdin closed, then signals).
_CLOSE_WAIT = 5.0
_LOG_LIMIT = 8 * 1024 * 1024
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
MISSING_SDK = "the mcp package is not installed (pip install 'mibyan[mcp]')"


@dataclass
class ServerState:
    """What is known of one server now. `settled` is done once it is ready or has failed."""

    name: str
    settings: McpServerSettings
    deadline: float
    status: Status = "starting"
    error: str | None = None
    tools: list[McpTool] | None = None  # the cached list until the server lists its own
    last_failure: str | None = None  # why it did not start in the last run (from the cache)
    last_failure_named: bool = False  # said already, by a toolset of these connections
    live: bool = False  # `tools` came from the server in this run
    pid: int | None = None
    confined_in: str | None = None  # where its sandbox lets it write, when it runs in one
    listing: Listing = field(default_factory=Listing)  # tools left out as not valid, a cut list
    settled: concurrent.futures.Future[None] = field(default_factory=concurrent.futures.Future)
    client: Any = None


def expand(text: str, env: Mapping[str, str], where: str) -> str:
    """`text` with each `${NAME}` replaced by the variable's value.

    Raises:
        ToolError: a variable is not set.
    """

    def value(match: re.Match[str]) -> str:
        if match.group(1) not in env:
            raise ToolError(f"{where}: ${{{match.group(1)}}} is not set in the environment")
        return env[match.group(1)]

    return _VARIABLE.sub(value, text)


class McpConnections:
    """The MCP servers of one agent, each connected once; close() stops them all.

    Args:
        servers: the configured servers, by name.
        home: the mibyan home (the tool cache, the servers' stderr log).
        start_timeout: seconds each server may take to start and list its tools.
        env: the environment `${NAME}`s come from, and what a stdio server inherits from.
        cwd: where a stdio server without `cwd:` runs (and a relative `cwd:` is taken from): the
            agent's working directory; the process's when None.
        confine: the sandbox a stdio server runs in, given the folder it runs in and its `writable:`
            places (the agent's own rules: it reads the machine and writes that folder, temp and those
            places; a gateway agent's, its workspace only); None runs the servers unconfined, as does a
            server's `sandbox: off`.
    """

    def __init__(
        self,
        servers: Mapping[str, McpServerSettings],
        *,
        home: Path,
        start_timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        confine: Callable[[Path, list[str]], Sandbox] | None = None,
    ) -> None:
        import importlib.util

        self._env = dict(os.environ if env is None else env)
        self._home = home
        self._cwd = cwd
        self._confine = confine
        self._cache = ToolCache(home)
        self.start_timeout = start_timeout
        self.servers = {name: self._state(name, settings) for name, settings in servers.items()}
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._scopes: dict[str, Any] = {}  # each server's cancel scope, on the MCP thread
        self._loop_ready = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="mibyan-mcp", daemon=True)
        if importlib.util.find_spec("mcp") is None:  # cheap, unlike the import: no thread, no servers
            self._closed = True
            for state in self.servers.values():
                self._settle(state, "failed", MISSING_SDK)

    def _state(self, name: str, settings: McpServerSettings) -> ServerState:
        cached = self._cache.load(settings)
        if cached is None:
            return ServerState(name, settings, float("inf"))
        return ServerState(
            name,
            settings,
            float("inf"),
            tools=cached.tools,
            last_failure=cached.failure,
            listing=cached.listing,
        )

    def start(self) -> None:
        """Start the servers, on the MCP thread, if they are not started yet (thread-safe, returns at once).

        The SDK's import holds the interpreter's lock for about half a second: started while the agent
        prepares its first request, it would delay the request by as much. So the agent starts its servers
        when it needs them: at once if it has to wait for one whose tools are not cached, else when its
        first model call is on its way (or its first MCP call comes, or the chat is idle at its prompt).
        """
        with self._lock:
            # no servers (a gateway agent that names none): no thread, and the SDK is never imported
            if not self.servers or self._closed or self._thread.is_alive() or self._loop_ready.is_set():
                return
            deadline = time.monotonic() + self.start_timeout
            for state in self.servers.values():
                state.deadline = deadline
            self._thread.start()

    # -- state, for the tools and for `mibyan mcp list` -------------------------------------------------

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` (on the MCP thread) whenever a server becomes ready or fails."""
        with self._lock:
            self._listeners.append(listener)

    def off_change(self, listener: Callable[[], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def wait_settled(self, names: list[str] | None = None, timeout: float | None = None) -> bool:
        """Block until the named servers (all by default) are ready or have failed; False on timeout."""
        self.start()
        states = [self.servers[n] for n in names] if names is not None else list(self.servers.values())
        _done, pending = concurrent.futures.wait([s.settled for s in states], timeout=timeout)
        return not pending

    def _settle(self, state: ServerState, status: Status, error: str | None = None) -> None:
        state.status = status
        state.error = error
        if not state.settled.done():
            state.settled.set_result(None)
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    # -- the MCP thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            for state in self.servers.values():
                if state.status in ("starting", "ready"):
                    self._settle(state, "stopped", state.error)
            self._loop_ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._loop_ready.set()
        for state in self.servers.values():
            missing = self._missing_program(state)
            if missing is not None:
                self._failed_to_start(state, missing)
        if all(state.status != "starting" for state in self.servers.values()):
            return  # nothing left to start: the SDK is not needed
        try:
            import mcp  # noqa: F401  (the SDK: imported here, off the agent's thread)
        except ImportError:
            for state in self.servers.values():
                self._settle(state, "failed", MISSING_SDK)
            return
        sdk_log = logging.getLogger("mcp")
        if not sdk_log.handlers:
            sdk_log.addHandler(logging.NullHandler())  # its records stay off the terminal
        if self._stop.is_set():  # closed while the SDK was imported
            return
        tasks = [asyncio.create_task(self._serve(state)) for state in self.servers.values()]
        await self._stop.wait()
        for name, scope in self._scopes.items():
            if self.servers[name].status == "starting":
                scope.cancel()  # closed before it was up: stop its start-up as well
        if tasks:
            await asyncio.wait(tasks, timeout=_CLOSE_WAIT)

    async def _serve(self, state: ServerState) -> None:
        """One server's whole connection: connect, list the tools, then hold it open until close()."""
        import anyio

        from mibyan.tools.mcp_listing import list_tools

        assert self._stop is not None
        with anyio.CancelScope() as scope:
            self._scopes[state.name] = scope
            watchdog = asyncio.create_task(self._watch_start(state, scope))
            try:
                client, check = self._client(state)
                async with client:
                    tools = await list_tools(state.name, client, check.listing)
                    state.client, state.tools, state.live = client, tools, True
                    state.listing = check.listing
                    self._cache.save(state.settings, tools, listing=check.listing)
                    self._settle(state, "ready")
                    await self._stop.wait()
            except Exception as exc:  # a broken server: reported as one line, the agent goes on without it
                log.info("MCP server %s failed", state.name, exc_info=exc)  # the user sees one line
                if state.status == "starting":  # not what its stopping raised, once it failed or was up
                    self._failed_to_start(state, _describe(exc) + self._sandbox_hint(state))
            finally:
                watchdog.cancel()
                state.client = None
        if scope.cancelled_caught and state.status == "starting":
            self._settle(state, "stopped", "stopped before it was up")
        elif state.status == "ready":
            self._settle(state, "stopped")

    async def _watch_start(self, state: ServerState, scope: Any) -> None:
        await asyncio.sleep(max(0.0, state.deadline - time.monotonic()))
        if state.status == "starting":
            # failed now, not once its process is stopped (that takes a grace period)
            self._failed_to_start(state, f"did not start within {self.start_timeout:g} s")
            scope.cancel()

    @staticmethod
    def _sandbox_hint(state: ServerState) -> str:
        """For a server that started in its sandbox and then failed: what the sandbox allowed, as the
        likeliest reason (a cache it could not write: npx's ~/.npm), and what to do about it."""
        if state.pid is None or state.confined_in is None:
            return ""
        return (
            f" (it runs in the sandbox, which lets it write only in {state.confined_in}; its stderr is in "
            f"logs/mcp.log; give it writable: [...] for what it must write, or sandbox: off)"
        )

    def _failed_to_start(self, state: ServerState, error: str) -> None:
        """Known as broken: the next start neither waits for it nor forgets to name it."""
        self._cache.save(state.settings, state.tools or [], failure=error, listing=state.listing)
        self._settle(state, "failed", error)

    def _client(self, state: ServerState) -> tuple[Any, Any]:
        """The SDK's client of the server, and what checks its tool lists (see mcp_listing)."""
        from mcp import Client, types

        from mibyan.tools.mcp_listing import ToolListCheck, checking_tool_lists
        from mibyan.tools.mcp_transport import http_transport, stdio_transport

        settings = state.settings
        where = f"mcp_servers.{state.name}"
        if settings.url is not None:
            headers = {
                key: self._expand(settings, value, f"{where}.headers.{key}")
                for key, value in settings.headers.items()
            }
            transport = http_transport(settings.url, headers)
        else:
            transport = stdio_transport(
                state.name,
                self._stdio_command(state),
                self._errlog(),
                on_started=lambda pid: setattr(state, "pid", pid),
                on_exit=lambda: self._exited(state),
            )
        info = types.Implementation(name="mibyan", version="0.1.0")
        clients: list[Any] = []
        check = ToolListCheck(state.name, lambda: clients[0].session.protocol_version if clients else None)
        clients.append(Client(checking_tool_lists(transport, check), client_info=info, mode="auto"))
        return clients[0], check

    def _exited(self, state: ServerState) -> None:
        """A stdio server's output ended: unless it is being stopped, it is gone (crashed, or quit)."""
        assert self._stop is not None
        if not self._stop.is_set() and state.status == "ready":
            self._settle(state, "failed", "the server exited")

    def _expand(self, settings: McpServerSettings, text: str, where: str) -> str:
        """`${NAME}`s from the environment, in the user's own servers only: an editor's are literal, or a
        repository's editor settings could send `${OPENAI_API_KEY}` to a URL of its choosing."""
        return text if settings.literal else expand(text, self._env, where)

    def _missing_program(self, state: ServerState) -> str | None:
        """Why a command server cannot start (its program missing or not executable), known before
        the SDK is imported; None for one whose program is there, or whose settings fail later."""
        settings = state.settings
        if settings.command is None:
            return None
        try:
            env, cwd = self._launch_env(state)
            program_path(os.path.expanduser(settings.command), str(cwd), env.get("PATH"))
        except OSError as exc:
            return _describe(exc)
        except ToolError:
            return None  # a variable it names is unset: said as its start fails, as before
        return None

    def _launch_env(self, state: ServerState) -> tuple[dict[str, str], Path]:
        """The environment and working directory a command server starts with."""
        settings = state.settings
        where = f"mcp_servers.{state.name}"
        env = {k: self._env[k] for k in INHERITED if k in self._env}
        env.update({k: self._expand(settings, v, f"{where}.env.{k}") for k, v in settings.env.items()})
        return env, Path(self._cwd or Path.cwd()) / os.path.expanduser(settings.cwd or ".")

    def _stdio_command(self, state: ServerState) -> Any:
        from mibyan.tools.mcp_transport import StdioCommand

        settings = state.settings
        assert settings.command is not None
        where = f"mcp_servers.{state.name}"
        env, cwd = self._launch_env(state)
        sandbox = None
        if self._confine is not None and settings.sandbox != "off":
            sandbox = self._confine(cwd, settings.writable)
            if sandbox.active:
                state.confined_in = ", ".join(str(p) for p in sandbox.writable_places()) or "no place"
            if sandbox.temp is not None:
                env["TMPDIR"] = str(sandbox.temp)  # its own, as the agent's commands have
        return StdioCommand(
            command=os.path.expanduser(settings.command),
            args=tuple(self._expand(settings, a, f"{where}.args") for a in settings.args),
            env=env,
            cwd=str(cwd),
            sandbox=sandbox,
        )

    def unconfined(self) -> list[str]:
        """The stdio servers that run outside the sandbox (`sandbox: off`, or no sandbox given)."""
        return [
            name
            for name, state in self.servers.items()
            if state.settings.transport == "stdio"
            and (self._confine is None or state.settings.sandbox == "off")
        ]

    def _errlog(self) -> IO[bytes]:
        """Where the servers' stderr goes: `$MIBYAN_HOME/logs/mcp.log` (0600), else nowhere.

        A file past `_LOG_LIMIT` is started afresh when a server starts.
        """
        folder = self._home / "logs"
        path = folder / "mcp.log"
        try:
            private_dir(folder)
            too_big = path.exists() and path.stat().st_size > _LOG_LIMIT
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_TRUNC if too_big else 0)
            fd = os.open(path, flags, 0o600)
        except OSError:
            fd = os.open(os.devnull, os.O_WRONLY)
        return os.fdopen(fd, "ab", buffering=0)

    # -- calls, from the executor's threads -----------------------------------------------------------

    def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        *,
        timeout: float,
        signal: InterruptSignal | None = None,
    ) -> Any:
        """Call `tool` of `server` and return the SDK's result; waits for the server to be up first.

        `signal` is the tool call's stop signal: set, the wait ends and the call is cancelled.

        Raises:
            ToolError: the server is not available, the call timed out, was interrupted, or failed.
        """
        self.start()
        state = self.servers[server]
        self._wait(state.settled, max(0.0, state.deadline - time.monotonic()) + 0.5, signal)
        if signal is not None and signal.is_set():
            raise ToolError("interrupted before the MCP server was up")
        client = state.client
        if state.status != "ready" or client is None or self._loop is None:
            raise ToolError(f"MCP server {server!r} is not available ({state.error or state.status})")
        future = asyncio.run_coroutine_threadsafe(_call(client, tool, arguments, timeout), self._loop)
        self._wait(future, timeout + 1.0, signal)
        if not future.done():
            future.cancel()
            if signal is not None and signal.is_set():
                raise ToolError("interrupted: the MCP call was cancelled")
            raise ToolError(f"MCP server {server!r} did not answer within {timeout:g} s")
        try:
            return future.result()
        except TimeoutError:
            raise ToolError(f"MCP server {server!r} did not answer within {timeout:g} s") from None
        except Exception as exc:  # the server's error, or a connection that broke: text for the model
            raise ToolError(f"MCP server {server!r}: {_describe(exc)}") from exc

    @staticmethod
    def _wait(future: concurrent.futures.Future[Any], timeout: float, signal: InterruptSignal | None) -> None:
        """Wait for `future`; inside a tool call (`signal`), an interrupt ends the wait too."""
        if signal is None:  # called from outside the executor: nothing to interrupt it
            concurrent.futures.wait([future], timeout)
            return
        future.add_done_callback(lambda _f: signal.notify())
        signal.wait_until(future.done, timeout)

    # -- closing --------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every server (their processes are gone when this returns). Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._thread.is_alive()
        if not started:
            for state in self.servers.values():
                self._settle(state, "stopped", state.error)
            return
        self._loop_ready.wait(_CLOSE_WAIT)
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(_CLOSE_WAIT + 1.0)

    def __enter__(self) -> McpConnections:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _call(client: Any, tool: str, arguments: dict[str, Any], timeout: float) -> Any:
    import anyio

    with anyio.fail_after(timeout):
        return await client.call_tool(tool, arguments)


def _describe(exc: BaseException) -> str:
    """One line about a failure: the SDK's message, or the first of an exception group's."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, ToolError):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"cannot start {exc.filename or 'the command'}: not found"
    if isinstance(exc, PermissionError):
        return f"cannot start {exc.filename or 'the command'}: permission denied"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
