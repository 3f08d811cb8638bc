"""The protocol's stdio: newline-delimited JSON-RPC on stdin and stdout, and nothing else on stdout.

`reserve_stdout` takes the real stdout for the protocol alone and points file descriptor 1 at
/dev/null, before anything else runs: a tool, a hook or a library that prints (even a child process
that inherits fd 1) can then never put a stray line between two protocol messages.

`StdioTransport` is the SDK's message transport over those two descriptors. Reading and writing happen
on two threads, so stdin and stdout may be pipes, files or terminals alike. A line that is not JSON, or
not a JSON-RPC message, is answered with a JSON-RPC error (the SDK would only log it), and the
connection goes on. Everything written is ASCII: a control character in model text travels as `\\u001b`,
never as a raw escape sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import threading
from typing import Any

log = logging.getLogger("mibyan.editors")

#: The longest message read (an editor may embed a whole file in a prompt).
MAX_LINE_BYTES = 50 * 1024 * 1024
#: What stands in for a line longer than that: not JSON, so it is answered as a parse error.
_TOO_LARGE = b"\x00"
PARSE_ERROR = -32700
INVALID_REQUEST = -32600


def reserve_stdout() -> int:
    """Keep the real stdout for the protocol; fd 1 (what print() and child processes write to) goes
    to /dev/null from now on. Returns the protocol's own descriptor."""
    protocol = os.dup(1)  # not inherited by child processes
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    return protocol


def encode(message: dict[str, Any]) -> bytes:
    """One message as one line of ASCII JSON: every control character in it travels escaped."""
    return (json.dumps(message, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def _error(code: int, message: str, request_id: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def check_message(line: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the message, None) for a JSON-RPC message, else (None, the error response to send)."""
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None, _error(PARSE_ERROR, "Parse error: the line is not JSON")
    if not isinstance(message, dict):
        return None, _error(INVALID_REQUEST, "Invalid Request: a message is one JSON object")
    request_id = message.get("id")
    if request_id is not None and not isinstance(request_id, str | int):
        return None, _error(INVALID_REQUEST, "Invalid Request: id must be a string or a number")
    method = message.get("method")
    if method is not None and not isinstance(method, str):
        return None, _error(INVALID_REQUEST, "Invalid Request: method must be a string", request_id)
    if method is None and ("id" not in message or not ("result" in message or "error" in message)):
        return None, _error(INVALID_REQUEST, "Invalid Request: no method, and not a response", request_id)
    if "params" in message and not isinstance(message["params"], dict | list | None):
        return None, _error(INVALID_REQUEST, "Invalid Request: params must be an object", request_id)
    return message, None


class StdioTransport:
    """JSON-RPC messages over two file descriptors (the SDK's `Transport`: send, receive, close)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._incoming: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._outgoing: queue.Queue[tuple[bytes, asyncio.Future[None]] | None] = queue.Queue()
        self._reader = os.fdopen(read_fd, "rb", closefd=False)
        self._write_fd = write_fd
        self._closed = False
        threading.Thread(target=self._read_lines, name="mibyan-acp-read", daemon=True).start()
        self._writer = threading.Thread(target=self._write_lines, name="mibyan-acp-write", daemon=True)
        self._writer.start()

    async def send(self, message: dict[str, Any]) -> None:
        """Write one message (as one line of ASCII JSON) and wait until it is out."""
        if self._closed:
            raise ConnectionError("the connection is closed")
        data = encode(message)
        done: asyncio.Future[None] = self._loop.create_future()
        self._outgoing.put((data, done))
        await done

    async def receive(self) -> dict[str, Any] | None:
        """The next JSON-RPC message; None at the end of stdin. Broken lines are answered, not returned."""
        while True:
            line = await self._incoming.get()
            if line is None:
                return None
            if not line.strip():
                continue
            message, error = check_message(line)
            if message is not None:
                return message
            assert error is not None
            log.warning("answered a malformed message: %s", error["error"]["message"])
            with contextlib.suppress(ConnectionError, OSError):
                await self.send(error)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._outgoing.put(None)
        await asyncio.to_thread(self._writer.join, 5)

    def _read_lines(self) -> None:
        try:
            while True:
                line = self._reader.readline(MAX_LINE_BYTES + 1)
                if not line:
                    break
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    while (rest := self._reader.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                        pass
                    line = _TOO_LARGE
                self._loop.call_soon_threadsafe(self._incoming.put_nowait, line)
        except (OSError, ValueError):
            log.warning("stdin could not be read any more", exc_info=True)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed already
                self._loop.call_soon_threadsafe(self._incoming.put_nowait, None)

    def _write_lines(self) -> None:
        while (item := self._outgoing.get()) is not None:
            data, done = item
            error: BaseException | None = None
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._write_fd, view) :]
            except OSError as exc:  # the editor went away
                error = ConnectionError(str(exc))
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(_settle, done, error)


def _settle(done: asyncio.Future[None], error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
