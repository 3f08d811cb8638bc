"""A scripted Chat Completions server on loopback, for end-to-end tests and benchmarks.

Each request takes the next scripted `Reply` (or asks `default` for one). Replies are sent as SSE
(chunked, keep-alive) when the request asks to stream, else as one JSON body. `GET .../models` lists
`server.models` (404 while it is None). The server records
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
        unended: send the whole stream, then close the connection without the chunked body's end.
        held_open: send the whole stream, then neither end the body nor close the connection (until the
            client hangs up, or 60 s).
        unanswered: close the connection without a word (after `delay`), as a server does whose
            keep-alive ran out the instant the request came (or that fell over while working on it).
        status: an HTTP error status to answer with instead (body from `error_body`).
        finish_reason: overrides the natural one.
        reasoning: reasoning_content to stream before the text.
        raw_arguments: the arguments text of each tool call as sent, when it must not be valid JSON.
        after_event: called with each stream event once it is sent (to hold the stream at a point).
        stall: seconds a stream pauses after its event number `stall_after` (0: the first; by default
            the second, in Chat Completions its first piece of text); a client hang-up ends the pause.
        progress: prompt-progress chunks streamed first when the request asks for them
            (`return_progress`, as llama.cpp's server does while it reads the prompt).
    """

    text: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    delay: float = 0.0
    cut: bool = False
    unended: bool = False
    held_open: bool = False
    unanswered: bool = False
    status: int = 200
    error_body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    finish_reason: str | None = None
    reasoning: str | None = None
    chunks: int = 3
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 10, "completion_tokens": 5})
    raw_arguments: list[str] | None = None
    after_event: Callable[[str], None] | None = None
    stall: float = 0.0
    stall_after: int = 1
    progress: int = 0


def held_until(release: threading.Event, text: str) -> Callable[[dict[str, Any]], Reply]:
    """A server's default reply that answers `text` only once the test sets `release` (a run held in
    flight while the test looks at it from outside)."""

    def reply(body: dict[str, Any]) -> Reply:
        release.wait(30)
        return Reply(text=text)

    return reply


@dataclass
class Seen:
    body: dict[str, Any]
    arrived: float
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    peer: tuple[str, int] = ("", 0)  # the client's end of the connection it came on


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many agents connecting at once (a gateway's channels) must not be refused

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
        self.models: list[dict[str, Any]] | None = None  # served at GET .../models; None: 404
        self.model_listings = 0  # how many times the models were asked for
        self.hangups = 0
        self._lock = threading.Lock()
        self._arrivals = threading.Condition(self._lock)
        self._counter = 0
        self._httpd = _QuietServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.01,), daemon=True)

    @property
    def base_url(self) -> str:
        """For the OpenAI SDK (Chat Completions and Responses)."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @property
    def root_url(self) -> str:
        """For the Anthropic SDK, which adds /v1/messages itself."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def url_for(self, api_mode: str) -> str:
        return self.root_url if api_mode == "anthropic_messages" else self.base_url

    def add(self, *replies: Reply) -> ScriptedServer:
        self.script.extend(replies)
        return self

    def wait_for_requests(self, count: int, timeout: float = 30.0) -> bool:
        """Block until the server has received `count` requests in all."""
        with self._arrivals:
            return self._arrivals.wait_for(lambda: len(self.requests) >= count, timeout)

    def wait_for_hangups(self, count: int, timeout: float = 10.0) -> bool:
        """Block until clients have hung up on `count` delayed replies in all."""
        with self._arrivals:
            return self._arrivals.wait_for(lambda: self.hangups >= count, timeout)

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
            disable_nagle_algorithm = True  # small writes go out at once, not after a delayed ACK

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if not self.path.endswith("/models"):
                    self._send_json(404, {"error": {"message": "not found"}}, {})
                    return
                with server._lock:
                    server.model_listings += 1
                if server.models is None:
                    self._send_json(404, {"error": {"message": "no model listing here"}}, {})
                else:
                    self._send_json(200, {"object": "list", "data": server.models}, {})

            def do_POST(self) -> None:
                arrived = time.perf_counter()
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._arrivals:
                    server.requests.append(
                        Seen(
                            body=body,
                            arrived=arrived,
                            path=self.path,
                            headers=dict(self.headers.items()),
                            peer=self.client_address[:2],
                        )
                    )
                    server._arrivals.notify_all()
                if self.path.endswith("/embeddings"):
                    self._send_json(200, embeddings(body), {})
                    return
                reply = server._next_reply(body)
                if reply.delay and not self._wait(reply.delay):
                    self._hung_up()
                    self.close_connection = True
                    return
                if reply.unanswered:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                wire = server._wire_for(self.path)
                if reply.status != 200:
                    self._send_json(
                        reply.status,
                        reply.error_body or {"error": {"message": "scripted error"}},
                        reply.headers,
                    )
                elif body.get("stream"):
                    self._send_stream(reply, body, wire)
                else:
                    self._send_json(200, wire.whole(reply), reply.headers)
                server.reply_sent_at.append(time.perf_counter())

            def _hung_up(self) -> None:
                with server._arrivals:
                    server.hangups += 1
                    server._arrivals.notify_all()

            def _wait(self, seconds: float) -> bool:
                """Wait, returning False as soon as the client hangs up (the one event waited on: bytes
                the client sends meanwhile do not wake it)."""
                hangup = select.poll()
                hangup.register(self.connection, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
                return not hangup.poll(seconds * 1000)

            def _send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _send_stream(self, reply: Reply, body: dict[str, Any], wire: Any) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                try:
                    for number, event in enumerate(wire.events(reply, body)):
                        data = event.encode()
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                        if reply.after_event is not None:
                            reply.after_event(event)
                        if number == reply.stall_after and reply.stall and not self._wait(reply.stall):
                            self._hung_up()
                            self.close_connection = True
                            return
                    if reply.held_open and not self._wait(60):
                        self._hung_up()
                    if reply.cut or reply.unended or reply.held_open:
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    self.close_connection = True

        return Handler

    def _wire_for(self, path: str) -> Any:
        if path.endswith("/messages"):
            return AnthropicWire(self)
        if path.endswith("/responses"):
            return ResponsesWire(self)
        return ChatWire(self)

    def _tool_calls(self, reply: Reply) -> list[dict[str, Any]]:
        raw = reply.raw_arguments or [json.dumps(args) for _, args in reply.tool_calls]
        return [
            {"id": self._call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
            for (name, _), arguments in zip(reply.tool_calls, raw, strict=True)
        ]


def embeddings(body: dict[str, Any]) -> dict[str, Any]:
    """A deterministic stand-in for an embedding model: a hashed bag of words."""
    import hashlib
    import re

    def vector(text: str) -> list[float]:
        values = [0.0] * 64
        for word in re.findall(r"\w+", text.lower()):
            if len(word) > 3:
                values[int(hashlib.sha1(word.encode()).hexdigest(), 16) % 64] += 1.0
        return values

    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    return {
        "object": "list",
        "model": body.get("model"),
        "usage": {"prompt_tokens": 1, "total_tokens": 1},
        "data": [{"object": "embedding", "index": i, "embedding": vector(t)} for i, t in enumerate(texts)],
    }


def _sse(data: dict[str, Any] | str, event: str | None = None) -> str:
    payload = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


def _split(text: str, pieces: int) -> list[str]:
    size = max(1, -(-len(text) // pieces))
    return [text[i : i + size] for i in range(0, len(text), size)]


class ChatWire:
    """Chat Completions bodies and chunks."""

    def __init__(self, server: ScriptedServer) -> None:
        self.server = server

    def whole(self, reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if reply.tool_calls:
            message["tool_calls"] = self.server._tool_calls(reply)
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "scripted",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {**reply.usage, "total_tokens": sum(reply.usage.values())},
        }

    def events(self, reply: Reply, body: dict[str, Any]) -> list[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return _sse(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "model": "scripted",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        events = []
        if body.get("return_progress"):  # llama.cpp's: no choices, the prompt's progress instead
            total = 3000
            for step in range(reply.progress):
                done = total * (step + 1) // reply.progress
                progress = {"total": total, "cache": 0, "processed": done, "time_ms": 10 * step}
                events.append(
                    _sse(
                        {
                            "id": "chatcmpl-1",
                            "object": "chat.completion.chunk",
                            "choices": [],
                            "model": "scripted",
                            "prompt_progress": progress,
                        }
                    )
                )
        events.append(chunk({"role": "assistant", "content": ""}))
        if reply.reasoning:
            events.append(chunk({"reasoning_content": reply.reasoning}))
        if reply.text:
            events.extend(chunk({"content": piece}) for piece in _split(reply.text, reply.chunks))
        for index, call in enumerate(self.server._tool_calls(reply)):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            first = {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": arguments[:half]},
            }
            events.append(chunk({"tool_calls": [first]}))
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": arguments[half:]}}]})
            )
        if reply.cut:
            return events
        events.append(chunk({}, reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(
                _sse(
                    {
                        "id": "chatcmpl-1",
                        "object": "chat.completion.chunk",
                        "choices": [],
                        "usage": {**reply.usage, "total_tokens": sum(reply.usage.values())},
                    }
                )
            )
        events.append(_sse("[DONE]"))
        return events


class AnthropicWire:
    """Anthropic Messages bodies and events."""

    def __init__(self, server: ScriptedServer) -> None:
        self.server = server

    def _usage(self, reply: Reply) -> dict[str, int]:
        return {
            "input_tokens": reply.usage["prompt_tokens"],
            "output_tokens": reply.usage["completion_tokens"],
        }

    def _blocks(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.reasoning:
            blocks.append(
                {"type": "thinking", "thinking": reply.reasoning, "signature": "sig-" + reply.reasoning[:8]}
            )
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        for call in self.server._tool_calls(reply):
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call["id"].replace("call_", "toolu_"),
                    "name": call["function"]["name"],
                    "input": json.loads(call["function"]["arguments"]),
                }
            )
        return blocks

    def _stop(self, reply: Reply) -> str:
        return {"length": "max_tokens"}.get(
            reply.finish_reason or "", "tool_use" if reply.tool_calls else "end_turn"
        )

    def whole(self, reply: Reply) -> dict[str, Any]:
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "scripted",
            "content": self._blocks(reply),
            "stop_reason": self._stop(reply),
            "usage": self._usage(reply),
        }

    def events(self, reply: Reply, body: dict[str, Any]) -> list[str]:
        start = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "scripted",
            "usage": {"input_tokens": reply.usage["prompt_tokens"], "output_tokens": 1},
        }
        events = [_sse({"type": "message_start", "message": start}, "message_start")]
        for index, block in enumerate(self._blocks(reply)):
            kind = block["type"]
            empty = {
                "thinking": {"type": "thinking", "thinking": "", "signature": ""},
                "text": {"type": "text", "text": ""},
                "tool_use": {**block, "input": {}},
            }[kind]
            events.append(
                _sse(
                    {"type": "content_block_start", "index": index, "content_block": empty},
                    "content_block_start",
                )
            )
            if kind == "thinking":
                deltas = [
                    {"type": "thinking_delta", "thinking": block["thinking"]},
                    {"type": "signature_delta", "signature": block["signature"]},
                ]
            elif kind == "text":
                deltas = [
                    {"type": "text_delta", "text": piece} for piece in _split(block["text"], reply.chunks)
                ]
            else:
                raw = json.dumps(block["input"])
                deltas = [{"type": "input_json_delta", "partial_json": piece} for piece in _split(raw, 2)]
            events.extend(
                _sse({"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta")
                for d in deltas
            )
            events.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        if reply.cut:
            return events
        events.append(
            _sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._stop(reply)},
                    "usage": {"output_tokens": reply.usage["completion_tokens"]},
                },
                "message_delta",
            )
        )
        events.append(_sse({"type": "message_stop"}, "message_stop"))
        return events


class ResponsesWire:
    """OpenAI Responses bodies and events."""

    def __init__(self, server: ScriptedServer) -> None:
        self.server = server

    def whole(self, reply: Reply) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        if reply.reasoning:
            output.append(
                {
                    "id": "rs_1",
                    "type": "reasoning",
                    "encrypted_content": "enc-" + reply.reasoning,
                    "summary": [{"type": "summary_text", "text": reply.reasoning}],
                }
            )
        if reply.text:
            output.append(
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
                }
            )
        for call in self.server._tool_calls(reply):
            output.append(
                {
                    "id": "fc_" + call["id"],
                    "type": "function_call",
                    "status": "completed",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"],
                }
            )
        incomplete = reply.finish_reason == "length"
        return {
            "id": "resp_1",
            "object": "response",
            "model": "scripted",
            "output": output,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "usage": {
                "input_tokens": reply.usage["prompt_tokens"],
                "output_tokens": reply.usage["completion_tokens"],
            },
        }

    def events(self, reply: Reply, body: dict[str, Any]) -> list[str]:
        final = self.whole(reply)
        events = [
            _sse(
                {"type": "response.created", "response": {**final, "output": [], "status": "in_progress"}},
                "response.created",
            )
        ]
        for index, item in enumerate(final["output"]):
            events.append(
                _sse(
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": {**item, "arguments": ""} if item["type"] == "function_call" else item,
                    },
                    "response.output_item.added",
                )
            )
            if item["type"] == "reasoning":
                events.append(
                    _sse(
                        {
                            "type": "response.reasoning_summary_text.delta",
                            "output_index": index,
                            "delta": reply.reasoning,
                        },
                        "response.reasoning_summary_text.delta",
                    )
                )
            elif item["type"] == "message":
                events.extend(
                    _sse(
                        {"type": "response.output_text.delta", "output_index": index, "delta": piece},
                        "response.output_text.delta",
                    )
                    for piece in _split(reply.text or "", reply.chunks)
                )
            else:
                events.extend(
                    _sse(
                        {
                            "type": "response.function_call_arguments.delta",
                            "output_index": index,
                            "delta": piece,
                        },
                        "response.function_call_arguments.delta",
                    )
                    for piece in _split(item["arguments"], 2)
                )
            events.append(
                _sse(
                    {"type": "response.output_item.done", "output_index": index, "item": item},
                    "response.output_item.done",
                )
            )
        if reply.cut:
            return events
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        events.append(_sse({"type": kind, "response": final}, kind))
        return events


def user_texts(body: dict[str, Any]) -> list[str]:
    """The text of every user message in a request's body, in order."""
    texts = []
    for message in body["messages"]:
        if message["role"] == "user":
            content = message["content"]
            texts.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
    return texts


def echo(body: dict[str, Any]) -> Reply:
    """A model that answers with how many user messages its session holds, and the last one."""
    texts = user_texts(body)
    return Reply(text=f"echo {len(texts)}: {texts[-1]}")
