"""OpenAI Chat Completions: request building and reply parsing, streamed and plain.

The request goes out through the openai SDK's low-level `post` with a body we serialize ourselves:
the SDK's typed `create()` re-walks every message on every call, which costs most of a second on a
long history. Replies come back as plain dicts and both paths end in the same parsing code.
"""

from __future__ import annotations

import uuid
from typing import Any

from mibyan.agent.adapters.base import (
    EncodedList,
    NormalizedResponse,
    StreamEvents,
    Usage,
    WireAdapter,
    WireRequest,
    encode_json,
    malformed,
)
from mibyan.agent.messages import Message, ToolCall
from mibyan.core.by_identity import ByIdentity
from mibyan.core.errors import ProviderError
from mibyan.tools.schema import ToolSchema

#: Keys of our history that the Chat Completions wire format has no place for.
_PRIVATE_KEYS = frozenset({"reasoning", "provider_data"})
_FINISH_REASONS = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}


def wire_message(message: Message) -> dict[str, Any]:
    """The message as Chat Completions takes it: our private keys left out."""
    return {key: value for key, value in message.items() if key not in _PRIVATE_KEYS}


def _wire_and_text(message: Message) -> tuple[dict[str, Any], str]:
    wire = wire_message(message)
    return wire, encode_json(wire)


#: each message of a history in its wire form and JSON text, made once: a history is sent whole at
#: every request, and its messages are never changed once made
_WIRED: ByIdentity[Message, tuple[dict[str, Any], str]] = ByIdentity(
    _wire_and_text,
    weigh=lambda wired: 2 * len(wired[1]),  # the message and its text
)


def wire_messages(system_prompt: str | None, messages: list[Message]) -> EncodedList:
    """The request's messages as Chat Completions takes them, the system prompt first, with their text."""
    wired = [_WIRED(m) for m in messages]
    if system_prompt:
        system = {"role": "system", "content": system_prompt}
        wired.insert(0, (system, encode_json(system)))
    return _encoded(wired)


def _wire_tool(tool: ToolSchema) -> tuple[dict[str, Any], str]:
    wire = {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }
    return wire, encode_json(wire)


#: each tool in its wire form and JSON text, made once: an agent's tools are the same in every request
_WIRED_TOOLS: ByIdentity[ToolSchema, tuple[dict[str, Any], str]] = ByIdentity(
    _wire_tool, weigh=lambda wired: 2 * len(wired[1])
)


def _encoded(wired: list[tuple[dict[str, Any], str]]) -> EncodedList:
    return EncodedList([wire for wire, _ in wired], encoded="[" + ",".join(text for _, text in wired) + "]")


def wire_tools(tools: list[ToolSchema]) -> EncodedList:
    """The tools as Chat Completions takes them, with their text."""
    return _encoded([_WIRED_TOOLS(t) for t in tools])


def parse_usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    return Usage(
        input_tokens=int(raw.get("prompt_tokens") or 0),
        output_tokens=int(raw.get("completion_tokens") or 0),
        cache_read_tokens=int(prompt_details.get("cached_tokens") or 0),
        reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0),
    )


def _normal_tool_call(index: int, call_id: Any, name: Any, arguments: Any) -> ToolCall:
    return {
        "id": call_id or f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name or "", "arguments": arguments or "{}"},
    }


def _finish(reason: Any, tool_calls: list[ToolCall]) -> str:
    if tool_calls and reason in (None, "stop"):
        # Some OpenAI-compatible servers say "stop" after tool calls; the calls are what counts.
        return "tool_calls"
    return _FINISH_REASONS.get(str(reason), "stop")


def parse_completion(data: Any) -> NormalizedResponse:
    """Parse a non-streamed `chat.completion` body."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise malformed("a chat completion", data) from None
    tool_calls = [
        _normal_tool_call(
            i, call.get("id"), call.get("function", {}).get("name"), call.get("function", {}).get("arguments")
        )
        for i, call in enumerate(message.get("tool_calls") or [])
    ]
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    return NormalizedResponse(
        content=message.get("content"),
        tool_calls=tool_calls,
        reasoning=reasoning if isinstance(reasoning, str) else None,
        finish_reason=_finish(choice.get("finish_reason"), tool_calls),
        usage=parse_usage(data.get("usage")),
    )


class ChatStreamAssembler:
    """Builds one NormalizedResponse out of `chat.completion.chunk` dicts.

    Tool-call deltas are joined by their `index`; text and reasoning deltas are passed on to `events`
    as they arrive. A stream that ends without a `finish_reason` was cut: `finish()` raises.
    """

    def __init__(self, events: StreamEvents) -> None:
        self._events = events
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish_reason: str | None = None
        self._usage = Usage()

    def feed(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            raise ProviderError(f"unexpected stream event: {str(chunk)[:200]}", reason="malformed_reply")
        if chunk.get("usage"):
            self._usage = parse_usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                self._text.append(text)
                self._events.on_text(text)
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str) and thought:
                self._reasoning.append(thought)
                self._events.on_reasoning(thought)
            for part in delta.get("tool_calls") or ():
                self._feed_tool_call(part)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]

    def _feed_tool_call(self, part: dict[str, Any]) -> None:
        index = int(part.get("index") or 0)
        call = self._calls.get(index)
        function = part.get("function") or {}
        if call is None:
            call = self._calls[index] = {"id": None, "name": "", "arguments": []}
        if part.get("id"):
            call["id"] = part["id"]
        if function.get("name"):
            first = not call["name"]
            call["name"] += function["name"]
            if first:
                self._events.on_tool_call(call["name"])
        if function.get("arguments"):
            call["arguments"].append(function["arguments"])

    @property
    def complete(self) -> bool:
        """Never from the chunks: a usage chunk may follow the finish_reason, and `[DONE]`, which ends
        the stream, never reaches the assembler (the Stream reports it: `StreamToTheEnd.on_whole`)."""
        return False

    def finish(self) -> NormalizedResponse:
        if self._finish_reason is None:
            raise ProviderError("the stream ended before the reply was complete", reason="dropped_stream")
        tool_calls = [
            _normal_tool_call(i, c["id"], c["name"], "".join(c["arguments"]))
            for i, c in sorted(self._calls.items())
        ]
        return NormalizedResponse(
            content="".join(self._text) or None,
            tool_calls=tool_calls,
            reasoning="".join(self._reasoning) or None,
            finish_reason=_finish(self._finish_reason, tool_calls),
            usage=self._usage,
        )


class ChatCompletionsAdapter(WireAdapter):
    """The `chat_completions` API mode."""

    api_mode = "chat_completions"
    path = "/chat/completions"

    def build_request(self, request: WireRequest) -> dict[str, Any]:
        wire = wire_messages(request.system_prompt, request.messages)
        body: dict[str, Any] = {"model": request.model, "messages": wire, "stream": request.stream}
        if request.tools:
            body["tools"] = wire_tools(request.tools)
            if not request.allow_tool_calls:
                body["tool_choice"] = "none"
        if request.stream:
            body["stream_options"] = {"include_usage": True}
            if request.prompt_progress:
                body["return_progress"] = True
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        return body

    def parse_reply(self, data: Any) -> NormalizedResponse:
        return parse_completion(data)

    def assembler(self, events: StreamEvents) -> ChatStreamAssembler:
        return ChatStreamAssembler(events)

    def request_options(self, timeout: float) -> dict[str, Any]:
        return {**super().request_options(timeout), "security": {"bearer_auth": True}}
