"""A real `mibyan acp` process driven by the ACP Python SDK's client side, for tests and benchmarks.

`EditorProcess` starts the process and talks to it from an asyncio loop on a thread of its own, so a
test calls it like blocking code. Every raw line the process writes to stdout is kept (`raw_lines`)
before the SDK reads it, so a test can check that nothing but protocol messages came out.
`Editor` is the client: it records the session updates, answers permission questions from a script,
and keeps files in "buffers" of its own (fs/read_text_file and fs/write_text_file), as an editor does.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from acp import PROTOCOL_VERSION
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    FileSystemCapabilities,
    ReadTextFileResponse,
    RequestPermissionResponse,
    TextContentBlock,
    WriteTextFileResponse,
)

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
WAIT = 30.0


class Editor:
    """The client side: what an editor does with what the agent sends and asks."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.permission_requests: list[Any] = []
        self.answers: list[str] = []  # "once", "always", "deny" or "hold" (never answer), in turn
        self.buffers: dict[str, str] = {}  # path -> text the editor holds (unsaved changes)
        self.file_requests: list[tuple[str, str]] = []  # ("read" | "write", path)
        self._changed = threading.Condition()

    def wait_for(self, condition: Callable[[], bool], timeout: float = WAIT) -> None:
        with self._changed:
            if not self._changed.wait_for(condition, timeout):
                raise AssertionError("the editor did not see what it waited for")

    def note(self) -> None:
        """Wake whoever waits: something changed."""
        with self._changed:
            self._changed.notify_all()

    def of(self, session_id: str) -> list[Any]:
        """The updates of one session, in the order they arrived."""
        with self._changed:
            return [update for sid, update in self.updates if sid == session_id]

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        with self._changed:
            self.updates.append((session_id, update))
            self._changed.notify_all()

    async def request_permission(
        self, options: list[Any], session_id: str, tool_call: Any, **kwargs: Any
    ) -> RequestPermissionResponse:
        with self._changed:
            self.permission_requests.append(tool_call)
            answer = self.answers.pop(0) if self.answers else "deny"
            self._changed.notify_all()
        if answer == "hold":
            await asyncio.Event().wait()  # until the agent withdraws the question
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=answer))

    async def read_text_file(self, path: str, session_id: str, **kwargs: Any) -> ReadTextFileResponse:
        self.file_requests.append(("read", path))
        self.note()
        text = self.buffers[path] if path in self.buffers else Path(path).read_text(encoding="utf-8")
        return ReadTextFileResponse(content=text)

    async def write_text_file(
        self, content: str, path: str, session_id: str, **kwargs: Any
    ) -> WriteTextFileResponse:
        self.file_requests.append(("write", path))
        self.buffers[path] = content
        self.note()
        return WriteTextFileResponse()


class EditorProcess:
    """`mibyan acp` as an editor runs it; use as a context manager. Calls block until answered."""

    def __init__(self, home: Path, *args: str, env: dict[str, str] | None = None, files: bool = True) -> None:
        self.home = home
        self.args = args
        self.env = env or {}
        self.editor = Editor()
        self.raw_lines: list[bytes] = []
        self.files = files
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.process: asyncio.subprocess.Process | None = None
        self.connection: ClientSideConnection | None = None

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = WAIT) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def start(self, coroutine: Coroutine[Any, Any, T]) -> Any:
        """Start a request without waiting; `.result(timeout)` of what this returns waits for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def __enter__(self) -> EditorProcess:
        self._thread.start()
        self.run(self._spawn())
        return self

    def __exit__(self, *exc: object) -> None:
        self.run(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _spawn(self) -> None:
        environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        environment.update({"MIBYAN_HOME": str(self.home), "PYTHONPATH": str(ROOT)})
        environment.update(self.env)
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mibyan.cli.main",
            "acp",
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=environment,
            limit=50 * 1024 * 1024,
        )
        assert self.process.stdin is not None
        reader = asyncio.StreamReader(limit=50 * 1024 * 1024)
        self._tee = asyncio.ensure_future(self._keep_raw(reader))
        self.connection = ClientSideConnection(self.editor, self.process.stdin, reader)
        fs = FileSystemCapabilities(read_text_file=True, write_text_file=True) if self.files else None
        await self.connection.initialize(
            protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities(fs=fs)
        )

    async def _keep_raw(self, reader: asyncio.StreamReader) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            self.raw_lines.append(line)
            self.editor.note()
            reader.feed_data(line)
        reader.feed_eof()

    async def _stop(self) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 15)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        await self._tee
        if self.connection is not None:
            await self.connection.close()

    # -- the methods a test calls -------------------------------------------------------------------------

    @property
    def conn(self) -> ClientSideConnection:
        assert self.connection is not None
        return self.connection

    def new_session(self, cwd: Path, mcp_servers: list[Any] | None = None) -> str:
        return self.run(self.conn.new_session(cwd=str(cwd), mcp_servers=mcp_servers or [])).session_id

    def prompt(self, session_id: str, text: str) -> str:
        """Send a prompt and wait for its stop reason."""
        return str(self.run(self._prompt(session_id, text)))

    def start_prompt(self, session_id: str, text: str) -> Any:
        return self.start(self._prompt(session_id, text))

    async def _prompt(self, session_id: str, text: str) -> str:
        response = await self.conn.prompt(
            session_id=session_id, prompt=[TextContentBlock(type="text", text=text)]
        )
        return str(response.stop_reason)

    def cancel(self, session_id: str) -> None:
        self.run(self.conn.cancel(session_id=session_id))

    def load(self, session_id: str, cwd: Path) -> None:
        self.run(self.conn.load_session(cwd=str(cwd), session_id=session_id, mcp_servers=[]))

    def send_raw(self, line: bytes) -> None:
        async def write() -> None:
            assert self.process is not None and self.process.stdin is not None
            self.process.stdin.write(line)
            await self.process.stdin.drain()

        self.run(write())


def kinds(updates: list[Any]) -> list[str]:
    """Each update's `sessionUpdate` tag, with a tool call's status: "tool_call:pending", ..."""
    shown = []
    for update in updates:
        tag = update.session_update
        if tag in ("tool_call", "tool_call_update") and update.status:
            tag = f"{tag}:{update.status}"
        shown.append(tag)
    return shown


def answer_text(updates: list[Any]) -> str:
    return "".join(u.content.text for u in updates if u.session_update == "agent_message_chunk")
