"""A scripted Chat Completions server on loopback, for end-to-end tests and benchmarks.

Each request takes the next scripted `Reply` (or asks `default` for one). Replies are sent as SSE
(chunked, keep-alive) when the request asks to stream, else as one JSON body. The server records
every request body, when it arrived, and whether a client hung up while the server was still busy.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted reply.

    Attributes:
        text: the answer text (split into `chunks` stream pieces).
        tool_calls: (name, arguments dict) pairs.
        delay: seconds to wait before answering (a client hang-up ends the wait).
        cut: stop the stream before the finish_reason chunk and close the connection.
        status: an HTTP error status to answer with instead (body from `error_body`).
        finish_reason: overrides the natural one.
        reasoning: reasoning_content to stream before the text.
    """

    text: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    delay: float = 0.0
    cut: bool = False
    status: int = 200
    error_body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    finish_reason: str | None = None
    reasoning: str | None = None
    chunks: int = 3
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 10, "completion_tokens": 5})


@dataclass
class Seen:
    body: dict[str, Any]
    arrived: float
    path: str


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that exit without closing a keep-alive connection reset it: not worth a traceback.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class ScriptedServer:
    """Run with `with ScriptedServer() as server:`; point clients at `server.base_url`."""

    def __init__(self, default: Callable[[dict[str, Any]], Reply] | None = None) -> None:
        self.script: deque[Reply] = deque()
        self.default = default
        self.requests: list[Seen] = []
        self.reply_sent_at: list[float] = []
        self.hangups = 0
        self._lock = threading.Lock()
        self._arrivals = threading.Condition(self._lock)
        self._counter = 0
        self._httpd = _QuietServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def add(self, *replies: Reply) -> ScriptedServer:
        self.script.extend(replies)
        return self

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> bool:
        """Block until the server has received `count` requests in all."""
        with self._arrivals:
            return self._arrivals.wait_for(lambda: len(self.requests) >= count, timeout)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self.script:
                return self.script.popleft()
        if self.default is not None:
            return self.default(body)
        return Reply(text="(the script is empty)")

    def _call_id(self) -> str:
        with self._lock:
            self._counter += 1
            return f"call_{self._counter}"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                arrived = time.perf_counter()
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._arrivals:
                    server.requests.append(Seen(body=body, arrived=arrived, path=self.path))
                    server._arrivals.notify_all()
                reply = server._next_reply(body)
                if reply.delay and not self._wait(reply.delay):
                    with server._lock:
                        server.hangups += 1
                    self.close_connection = True
                    return
                if reply.status != 200:
                    self._send_json(
                        reply.status,
                        reply.error_body or {"error": {"message": "scripted error"}},
                        reply.headers,
                    )
                elif body.get("stream"):
                    self._send_stream(reply, body)
                else:
                    self._send_json(200, server._completion(reply), reply.headers)
                server.reply_sent_at.append(time.perf_counter())

            def _wait(self, seconds: float) -> bool:
                """Wait, returning False as soon as the client hangs up."""
                deadline = time.monotonic() + seconds
                while (left := deadline - time.monotonic()) > 0:
                    readable, _, _ = select.select([self.connection], [], [], left)
                    if readable:
                        try:
                            if not self.connection.recv(1, socket.MSG_PEEK):
                                return False
                        except OSError:
                            return False
                        time.sleep(0.01)
                return True

            def _send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _send_stream(self, reply: Reply, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for event in server._chunks(reply, body):
                        data = f"data: {event}\n\n".encode()
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                    if reply.cut:
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    self.close_connection = True

        return Handler

    def _tool_calls(self, reply: Reply) -> list[dict[str, Any]]:
        return [
            {
                "id": self._call_id(),
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for name, args in reply.tool_calls
        ]

    def _finish_reason(self, reply: Reply) -> str:
        return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")

    def _completion(self, reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = self._tool_calls(reply)
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "scripted",
            "choices": [{"index": 0, "message": message, "finish_reason": self._finish_reason(reply)}],
            "usage": {**reply.usage, "total_tokens": sum(reply.usage.values())},
        }

    def _chunks(self, reply: Reply, body: dict[str, Any]) -> list[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return json.dumps(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "model": "scripted",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        events = [chunk({"role": "assistant", "content": ""})]
        if reply.reasoning:
            events.append(chunk({"reasoning_content": reply.reasoning}))
        if reply.text:
            size = max(1, -(-len(reply.text) // reply.chunks))
            events.extend(
                chunk({"content": reply.text[i : i + size]}) for i in range(0, len(reply.text), size)
            )
        for index, call in enumerate(self._tool_calls(reply)):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            events.append(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call["id"],
                                "type": "function",
                                "function": {"name": call["function"]["name"], "arguments": arguments[:half]},
                            }
                        ]
                    }
                )
            )
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
            )
        if reply.cut:
            return events
        events.append(chunk({}, self._finish_reason(reply)))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(
                json.dumps(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion.chunk",
                        "choices": [],
                        "usage": {**reply.usage, "total_tokens": sum(reply.usage.values())},
                    }
                )
            )
        events.append("[DONE]")
        return events
