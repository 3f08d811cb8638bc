"""What every API-mode adapter produces and consumes, whatever its wire format."""

from __future__ import annotations

import contextlib
import functools
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mibyan.agent.messages import Message, ToolCall, assistant_message
from mibyan.core.errors import ProviderError
from mibyan.tools.schema import ToolSchema


class EncodedList(list):  # type: ignore[type-arg]
    """A part of a request body that is the same in many requests (an agent's tools), with its JSON text
    made once: `encode_body` puts the text in rather than encoding the part again."""

    def __init__(self, items: list[Any], encoded: str | None = None) -> None:
        super().__init__(items)
        self.encoded = encode_json(items) if encoded is None else encoded


def encode_json(value: Any) -> str:
    """`value` as the JSON text of a request body (compact, not ASCII-escaped)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def encode_body(body: dict[str, Any]) -> bytes:
    """The request body as the JSON bytes sent; its EncodedList parts are put in as they were encoded."""
    kept = {key: value for key, value in body.items() if isinstance(value, EncodedList)}
    if not kept or len(kept) == len(body):
        return encode_json(body).encode()
    text = encode_json({key: value for key, value in body.items() if key not in kept})
    parts = "".join(f",{encode_json(key)}:{value.encoded}" for key, value in kept.items())
    return (text[:-1] + parts + "}").encode()


@dataclass
class Usage:
    """Token counts of one call, or summed over many. `input_tokens` includes cached ones."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.reasoning_tokens += other.reasoning_tokens

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "total_tokens": self.input_tokens + self.output_tokens,
        }


@dataclass
class NormalizedResponse:
    """One model reply, the same shape for every API mode and for streamed and plain calls.

    `tool_calls` are in the OpenAI chat format (`id`, `type`, `function.name`, `function.arguments`).
    `finish_reason` is one of "stop", "tool_calls", "length", "content_filter" (mapped per mode).
    `provider_data` holds what the provider needs replayed verbatim on the next request.
    """

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    provider_data: dict[str, Any] | None = None

    def as_message(self) -> Message:
        """The reply as the assistant message the history keeps."""
        return assistant_message(
            self.content,
            tool_calls=self.tool_calls,
            reasoning=self.reasoning,
            provider_data=self.provider_data,
        )


class StreamEvents(Protocol):
    """Receives the pieces of a streamed reply as they arrive (on the call's worker thread)."""

    def on_text(self, delta: str) -> None: ...

    def on_reasoning(self, delta: str) -> None: ...

    def on_tool_call(self, name: str) -> None: ...


class CallHandle:
    """Shared by the waiting thread and the worker making a call: once abandoned, the worker stops
    passing events on and its result is discarded.

    `last_heard` is when the answer last moved (monotonic seconds), None until its first piece (text,
    reasoning or a tool call) arrives: the waiting thread bounds the silence of a flowing answer by the
    stall timeout, and the wait for the first piece by the call's own timeout. A local model reading a
    long prompt is silent for a long time before it answers, and that is not a stall.
    """

    def __init__(self, wake: Callable[[], None] = lambda: None) -> None:
        self.abandoned = False
        self.last_heard: float | None = None
        self.whole_at: float | None = None
        self._wake = wake  # the waiting thread, to look again

    def answer_whole(self) -> None:
        """The answer's last event came (what follows is only the end of its connection): the waiting
        thread gives the rest a moment, then cuts it off and keeps the answer."""
        if self.whole_at is None:
            self.whole_at = time.monotonic()
            self._wake()

    def whole(self) -> float | None:
        """Seconds since the answer became whole; None before."""
        return None if self.whole_at is None else time.monotonic() - self.whole_at

    def answer_moved(self) -> None:
        """A piece of the answer arrived: the stall clock starts, or starts over."""
        self.last_heard = time.monotonic()

    def event_arrived(self) -> None:
        """Any stream event arrived (a tool call's arguments, usage): it counts once the answer flows."""
        if self.last_heard is not None:
            self.last_heard = time.monotonic()

    def silence(self) -> float | None:
        """Seconds since the answer last moved; None before its first piece."""
        return None if self.last_heard is None else time.monotonic() - self.last_heard


class _Heard:
    """The stream's events, passed on, each one restarting the call's stall clock."""

    def __init__(self, events: StreamEvents, handle: CallHandle) -> None:
        self._events = events
        self._handle = handle

    def on_text(self, delta: str) -> None:
        self._handle.answer_moved()
        self._events.on_text(delta)

    def on_reasoning(self, delta: str) -> None:
        self._handle.answer_moved()
        self._events.on_reasoning(delta)

    def on_tool_call(self, name: str) -> None:
        self._handle.answer_moved()
        self._events.on_tool_call(name)


@dataclass(frozen=True)
class WireRequest:
    """What one model call asks for, before any API mode's wire format.

    With `allow_tool_calls` False the tools are still described (Anthropic requires that when the history
    holds tool blocks) but the model may not call them.
    """

    model: str
    system_prompt: str
    messages: list[Message]
    tools: list[ToolSchema] = field(default_factory=list)
    stream: bool = True
    max_tokens: int | None = None
    temperature: float | None = None
    allow_tool_calls: bool = True
    prompt_progress: bool = False  # ask a llama.cpp server for progress chunks while it reads the prompt


class StreamAssembler(Protocol):
    """Builds one reply from a stream's events; `finish()` raises if the stream never completed.
    `complete` turns True with the stream's last event (what follows is only the body's end)."""

    def feed(self, event: Any) -> None: ...

    @property
    def complete(self) -> bool: ...

    def finish(self) -> NormalizedResponse: ...


class WireAdapter(ABC):
    """One API mode: converts history and tools to its wire format and parses replies back.

    Subclasses build the body and parse replies; the call itself lives here once for all modes. The
    body goes out through the SDK's low-level `post` pre-serialized (the typed `create()` would re-walk
    every message on every call), and replies come back as plain dicts, streamed or not.
    """

    api_mode: str
    path: str

    @abstractmethod
    def build_request(self, request: WireRequest) -> dict[str, Any]:
        """The request body for this mode."""

    @abstractmethod
    def parse_reply(self, data: Any) -> NormalizedResponse:
        """Parse a non-streamed reply body."""

    @abstractmethod
    def assembler(self, events: StreamEvents) -> StreamAssembler:
        """A fresh assembler for one streamed reply."""

    def request_options(self, timeout: float) -> dict[str, Any]:
        """Headers and timeout of one call.

        Every read may take up to `timeout`: the first byte of a reply comes only once the model has read
        the whole prompt. The silence of a stream that has started is the waiting thread's to bound
        (`CallHandle.silence`), not the socket's, which cannot tell the two waits apart.
        """
        return {"headers": {"Content-Type": "application/json"}, "timeout": timeout}

    def finish_reply(self, reply: NormalizedResponse, body: dict[str, Any]) -> NormalizedResponse:
        """A last look at a parsed reply with the request it answers (for what depends on both)."""
        return reply

    def stream_class(self) -> Any:
        """The SDK's Stream class for raw events, which splits the SSE body into them (openai's by
        default, reading the body to its end: see `_stream_to_the_end`)."""
        return _stream_to_the_end()

    def send(
        self,
        client: Any,
        body: dict[str, Any],
        *,
        stream: bool,
        events: StreamEvents,
        handle: CallHandle,
        timeout: float,
    ) -> NormalizedResponse:
        """Post `body` and return the parsed reply; a stream cut mid-way raises a dropped_stream error.

        Each event of the stream is reported to `handle`, whose waiter bounds a flowing answer's silence.
        """
        import httpx2

        content = encode_body(body)
        options = self.request_options(timeout)
        if not stream:
            data = client.post(self.path, cast_to=object, content=content, options=options)
            return self.finish_reply(self.parse_reply(data), body)
        chunks = client.post(
            self.path,
            cast_to=object,
            content=content,
            options=options,
            stream=True,
            stream_cls=self.stream_class(),
        )
        if hasattr(chunks, "on_whole"):
            chunks.on_whole = handle.answer_whole
        assembler = self.assembler(_Heard(events, handle))
        try:
            for chunk in chunks:
                if handle.abandoned:
                    break
                handle.event_arrived()
                assembler.feed(chunk)
                if assembler.complete:
                    handle.answer_whole()
        except Exception as exc:
            # The SDKs wrap transport errors in their own APIConnectionError; the rest is theirs to raise.
            sdk_dropped = type(exc).__name__ in ("APIConnectionError", "APITimeoutError")
            if not (sdk_dropped or isinstance(exc, httpx2.TransportError)):
                raise
            if handle.whole() is None:  # else only the body's end was cut: the answer is all there
                message = f"the connection dropped mid-stream: {exc}"
                raise ProviderError(message, reason="dropped_stream") from exc
        finally:
            chunks.response.close()
        return self.finish_reply(assembler.finish(), body)


@functools.cache  # a class made once (openai imported on first use, as the adapters import it)
def _stream_to_the_end() -> Any:
    from openai import APIConnectionError, APITimeoutError, Stream

    class StreamToTheEnd(Stream[object]):
        """openai's Stream, except that after `[DONE]` it reads the body to its end before the SDK
        closes it: a body closed unread (its last chunk, the few bytes after `[DONE]`) costs its
        connection, and the next call would open a new one (for a provider, a new TLS handshake).
        `on_whole` is called at `[DONE]`: a server that never ends the body is cut off (CallHandle)."""

        on_whole: Callable[[], None] = staticmethod(lambda: None)

        def _iter_events(self) -> Any:
            events = super()._iter_events()
            for event in events:
                if event.data.startswith("[DONE]"):
                    self.on_whole()
                    # the answer is whole: a body that breaks off now (or is cut) only costs the connection
                    with contextlib.suppress(APIConnectionError, APITimeoutError):
                        for _ in events:
                            pass
                yield event

    return StreamToTheEnd


def malformed(what: str, data: Any) -> ProviderError:
    return ProviderError(f"the model's reply is not {what}: {str(data)[:200]}", reason="malformed_reply")


Adapter = WireAdapter
