"""Anthropic Messages: history to content blocks and back, thinking blocks replayed verbatim.

The system prompt goes in `system`; consecutive tool results become one user message of `tool_result`
blocks (with `is_error` for failures); a user message right after them joins that same message, as the
API requires alternation. An assistant reply keeps every content block it came with (thinking with its
signature, redacted_thinking, text, tool_use, in their order) in `provider_data`, and that list is sent
back unchanged, because the API rejects a modified or reordered signed thinking block.
"""

from __future__ import annotations

import json
from typing import Any

from mibyan.agent.adapters.base import (
    NormalizedResponse,
    StreamEvents,
    Usage,
    WireAdapter,
    WireRequest,
    malformed,
)
from mibyan.agent.messages import AssistantMessage, Message, ToolCall, ToolMessage
from mibyan.core.errors import ProviderError

DEFAULT_MAX_TOKENS = 8192
_STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
    "pause_turn": "stop",
}
_BLOCKS_KEY = "anthropic_content"


def parse_usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    cache_read = int(raw.get("cache_read_input_tokens") or 0)
    cache_write = int(raw.get("cache_creation_input_tokens") or 0)
    return Usage(
        input_tokens=int(raw.get("input_tokens") or 0) + cache_read + cache_write,
        output_tokens=int(raw.get("output_tokens") or 0),
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )


def _arguments(input_value: Any) -> str:
    return json.dumps(input_value if input_value is not None else {}, ensure_ascii=False)


def normalize_blocks(blocks: list[dict[str, Any]], stop_reason: Any, usage: Usage) -> NormalizedResponse:
    """One NormalizedResponse from the content blocks of a reply (streamed or not)."""
    text = [b.get("text", "") for b in blocks if b.get("type") == "text"]
    thinking = [b.get("thinking", "") for b in blocks if b.get("type") == "thinking"]
    tool_calls: list[ToolCall] = [
        {
            "id": b["id"],
            "type": "function",
            "function": {"name": b["name"], "arguments": _arguments(b.get("input"))},
        }
        for b in blocks
        if b.get("type") == "tool_use"
    ]
    finish = _STOP_REASONS.get(str(stop_reason), "stop")
    if tool_calls and finish == "stop":
        finish = "tool_calls"
    keep = any(b.get("type") in ("thinking", "redacted_thinking") for b in blocks)
    return NormalizedResponse(
        content="".join(text) or None,
        tool_calls=tool_calls,
        reasoning="".join(thinking) or None,
        finish_reason=finish,
        usage=usage,
        provider_data={_BLOCKS_KEY: blocks} if keep else None,
    )


class AnthropicStreamAssembler:
    """Assembles `message_start` … `message_stop` events into a reply."""

    def __init__(self, events: StreamEvents) -> None:
        self._events = events
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._usage: dict[str, Any] = {}
        self._stop_reason: Any = None
        self._stopped = False
        self._cut_arguments: dict[str, str] = {}

    def feed(self, event: Any) -> None:
        if not isinstance(event, dict):
            raise malformed("an Anthropic stream event", event)
        kind = event.get("type")
        if kind == "message_start":
            self._usage.update((event.get("message") or {}).get("usage") or {})
        elif kind == "content_block_start":
            block = dict(event.get("content_block") or {})
            block.pop("caller", None)
            if block.get("type") == "tool_use":
                block["input"] = {}
                self._events.on_tool_call(str(block.get("name", "")))
            self._blocks[int(event["index"])] = block
        elif kind == "content_block_delta":
            self._delta(int(event["index"]), event.get("delta") or {})
        elif kind == "content_block_stop":
            index = int(event["index"])
            if index in self._json:
                raw = "".join(self._json.pop(index))
                try:
                    self._blocks[index]["input"] = json.loads(raw) if raw.strip() else {}
                except json.JSONDecodeError:
                    # Cut at max_tokens (the message_delta after it says so), or malformed: finish() decides.
                    self._blocks[index]["input"] = {}
                    self._cut_arguments[str(self._blocks[index].get("id"))] = raw
        elif kind == "message_delta":
            self._stop_reason = (event.get("delta") or {}).get("stop_reason") or self._stop_reason
            self._usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            self._stopped = True

    @property
    def complete(self) -> bool:
        return self._stopped

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.get("text", "")
            self._events.on_text(delta.get("text", ""))
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
            if delta.get("thinking"):
                self._events.on_reasoning(delta["thinking"])
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.get("signature", "")
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(delta.get("partial_json", ""))
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def finish(self) -> NormalizedResponse:
        if not self._stopped:
            raise ProviderError("the stream ended before the reply was complete", reason="dropped_stream")
        blocks = [self._blocks[i] for i in sorted(self._blocks)]
        reply = normalize_blocks(blocks, self._stop_reason, parse_usage(self._usage))
        if self._cut_arguments:
            if reply.finish_reason != "length":
                raise malformed("a tool call with JSON arguments", self._cut_arguments)
            # Cut at the token limit: the truncation handling refuses to run these; keep what came.
            for call in reply.tool_calls:
                if call["id"] in self._cut_arguments:
                    call["function"]["arguments"] = self._cut_arguments[call["id"]]
        return reply


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    stored = (message.get("provider_data") or {}).get(_BLOCKS_KEY)
    if stored:
        return list(stored)
    blocks: list[dict[str, Any]] = []
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"].get("arguments") or "{}")
        except json.JSONDecodeError:
            arguments = {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": call["function"]["name"],
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    return blocks or [{"type": "text", "text": "(no reply)"}]


def _tool_result(message: ToolMessage) -> dict[str, Any]:
    content = str(message.get("content") or "")
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": message["tool_call_id"],
        "content": content,
    }
    if content.startswith(("error:", "denied", "blocked", "interrupted")):
        block["is_error"] = True
    return block


def wire_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Our history as Anthropic messages: strictly alternating user and assistant turns of blocks."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "assistant":
            wire.append({"role": "assistant", "content": _assistant_blocks(message)})
            continue
        block = (
            _tool_result(message)
            if message["role"] == "tool"
            else {"type": "text", "text": str(message.get("content") or "")}
        )
        if wire and wire[-1]["role"] == "user":
            wire[-1]["content"].append(block)
        else:
            wire.append({"role": "user", "content": [block]})
    return wire


class AnthropicMessagesAdapter(WireAdapter):
    """The `anthropic_messages` API mode."""

    api_mode = "anthropic_messages"
    path = "/v1/messages"

    def __init__(self, *, thinking_budget: int | None = None) -> None:
        self.thinking_budget = thinking_budget

    def build_request(self, request: WireRequest) -> dict[str, Any]:
        # "messages" goes last: the body then grows only at its end from one turn to the next.
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
            "stream": request.stream,
        }
        if self.thinking_budget:
            body["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
            body["max_tokens"] = max(body["max_tokens"], self.thinking_budget + 1024)
        elif request.temperature is not None:
            body["temperature"] = request.temperature  # with thinking on, the API accepts only the default
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
            if not request.allow_tool_calls:
                body["tool_choice"] = {"type": "none"}
        if request.system_prompt:
            body["system"] = [{"type": "text", "text": request.system_prompt}]
        body["messages"] = wire_messages(request.messages)
        return body

    def parse_reply(self, data: Any) -> NormalizedResponse:
        if not isinstance(data, dict) or not isinstance(data.get("content"), list):
            raise malformed("an Anthropic message", data)
        blocks = [dict(b) for b in data["content"]]
        for block in blocks:
            block.pop("caller", None)
        return normalize_blocks(blocks, data.get("stop_reason"), parse_usage(data.get("usage")))

    def assembler(self, events: StreamEvents) -> AnthropicStreamAssembler:
        return AnthropicStreamAssembler(events)

    def stream_class(self) -> Any:
        from anthropic import Stream

        return Stream[object]  # it reads each body to its end itself (there is no `[DONE]`)
