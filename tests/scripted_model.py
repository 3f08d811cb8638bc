"""An in-process scripted model for loop logic: the SDK talks to it through `httpx2.MockTransport`.

It answers like the loopback server (tests/loopback.py: the same `Reply` script and the same wire formats
of the three API modes) but without sockets or threads, so a test of what the loop does with a reply runs
in microseconds and cannot hang. Wire behaviour (hang-ups, delays, timeouts) belongs to the loopback
server. `RawStream` sends hand-made SSE events, for replies no well-behaved script produces.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx2
from loopback import AnthropicWire, ChatWire, Reply, ResponsesWire, Seen

#: The address agents are given; nothing listens there, the transport answers.
BASE_URL = "http://scripted.model/v1"
ROOT_URL = "http://scripted.model"


@dataclass
class RawStream:
    """A streamed reply made of these SSE events, exactly as given."""

    events: list[str]


def sse(event: str, data: dict[str, Any]) -> str:
    """One SSE event, for RawStream."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


class ScriptedModel:
    """Each request takes the next scripted reply (or asks `default` for one) and is kept in `requests`."""

    def __init__(self, default: Callable[[dict[str, Any]], Reply] | None = None) -> None:
        self.script: deque[Reply | RawStream] = deque()
        self.default = default
        self.requests: list[Seen] = []
        self._counter = 0

    def add(self, *replies: Reply | RawStream) -> ScriptedModel:
        self.script.extend(replies)
        return self

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self._handle)

    def url_for(self, api_mode: str) -> str:
        return ROOT_URL if api_mode == "anthropic_messages" else BASE_URL

    def _tool_calls(self, reply: Reply) -> list[dict[str, Any]]:
        # The wires ask their server for call ids; these count from 1, like the loopback server's.
        raw = reply.raw_arguments or [json.dumps(args) for _, args in reply.tool_calls]
        calls = []
        for (name, _), arguments in zip(reply.tool_calls, raw, strict=True):
            self._counter += 1
            calls.append(
                {
                    "id": f"call_{self._counter}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        return calls

    def _handle(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content or b"{}")
        path = request.url.path
        self.requests.append(
            Seen(body=body, arrived=time.perf_counter(), path=path, headers=dict(request.headers))
        )
        reply = self.script.popleft() if self.script else None
        if reply is None:
            reply = self.default(body) if self.default is not None else Reply(text="(the script is empty)")
        if isinstance(reply, RawStream):
            return _stream(reply.events)
        if reply.status != 200:
            error = reply.error_body or {"error": {"message": "scripted error"}}
            return httpx2.Response(reply.status, json=error, headers=reply.headers)
        wire: Any = (
            AnthropicWire(self)  # type: ignore[arg-type]
            if path.endswith("/messages")
            else ResponsesWire(self)  # type: ignore[arg-type]
            if path.endswith("/responses")
            else ChatWire(self)  # type: ignore[arg-type]
        )
        if body.get("stream"):
            return _stream(wire.events(reply, body))
        return httpx2.Response(200, json=wire.whole(reply), headers=reply.headers)


def _stream(events: list[str]) -> httpx2.Response:
    return httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content="".join(events).encode()
    )
