"""OpenAI Responses: history to input items and back, encrypted reasoning replayed.

Requests are stateless (`store: false`) and ask for `reasoning.encrypted_content`, so each reasoning
item comes back sealed; the assistant message keeps its reasoning items (with the model that made them)
in `provider_data`, and they are sent back in order before that message's output on later requests.
Reasoning items from another model are not replayed: the API rejects them.
"""

from __future__ import annotations

from typing import Any

from mibyan.agent.adapters.base import (
    NormalizedResponse,
    StreamEvents,
    Usage,
    WireAdapter,
    WireRequest,
    malformed,
)
from mibyan.agent.messages import Message, ToolCall, tool_calls_of
from mibyan.core.errors import ProviderError

_ITEMS_KEY = "responses_reasoning"


def parse_usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    return Usage(
        input_tokens=int(raw.get("input_tokens") or 0),
        output_tokens=int(raw.get("output_tokens") or 0),
        cache_read_tokens=int((raw.get("input_tokens_details") or {}).get("cached_tokens") or 0),
        reasoning_tokens=int((raw.get("output_tokens_details") or {}).get("reasoning_tokens") or 0),
    )


def _replayable_reasoning(item: dict[str, Any]) -> dict[str, Any]:
    kept = {"type": "reasoning", "id": item.get("id"), "summary": item.get("summary") or []}
    if item.get("encrypted_content"):
        kept["encrypted_content"] = item["encrypted_content"]
    return kept


def normalize_output(response: dict[str, Any]) -> NormalizedResponse:
    """One NormalizedResponse from a `response` object (the plain reply, or `response.completed`'s)."""
    output = response.get("output")
    if not isinstance(output, list):
        raise malformed("a Responses API response", response)
    text: list[str] = []
    summaries: list[str] = []
    tool_calls: list[ToolCall] = []
    reasoning_items: list[dict[str, Any]] = []
    for item in output:
        kind = item.get("type")
        if kind == "message":
            text.extend(
                part.get("text", "")
                for part in item.get("content") or []
                if part.get("type") == "output_text"
            )
        elif kind == "function_call":
            tool_calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"},
                }
            )
        elif kind == "reasoning":
            reasoning_items.append(_replayable_reasoning(item))
            summaries.extend(part.get("text", "") for part in item.get("summary") or [])
    status = response.get("status")
    if status == "failed":
        error = response.get("error") or {}
        raise ProviderError(f"the response failed: {error.get('message') or error}", reason="server")
    if status == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        finish = "content_filter" if reason == "content_filter" else "length"
    else:
        finish = "tool_calls" if tool_calls else "stop"
    provider_data = {_ITEMS_KEY: reasoning_items, "model": response.get("model")} if reasoning_items else None
    return NormalizedResponse(
        content="".join(text) or None,
        tool_calls=tool_calls,
        reasoning="\n\n".join(s for s in summaries if s) or None,
        finish_reason=finish,
        usage=parse_usage(response.get("usage")),
        provider_data=provider_data,
    )


class ResponsesStreamAssembler:
    """Follows the stream's deltas for the callbacks; the final `response.completed` is the reply."""

    def __init__(self, events: StreamEvents) -> None:
        self._events = events
        self._final: dict[str, Any] | None = None

    def feed(self, event: Any) -> None:
        if not isinstance(event, dict):
            raise malformed("a Responses stream event", event)
        kind = event.get("type")
        if kind == "response.output_text.delta":
            self._events.on_text(str(event.get("delta", "")))
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            self._events.on_reasoning(str(event.get("delta", "")))
        elif (
            kind == "response.output_item.added" and (event.get("item") or {}).get("type") == "function_call"
        ):
            self._events.on_tool_call(str(event["item"].get("name", "")))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self._final = event.get("response") or {}
        elif kind == "error":
            raise ProviderError(
                f"the stream reported an error: {event.get('message') or event}", reason="server"
            )

    @property
    def complete(self) -> bool:
        return self._final is not None

    def finish(self) -> NormalizedResponse:
        if self._final is None:
            raise ProviderError("the stream ended before the reply was complete", reason="dropped_stream")
        return normalize_output(self._final)


def wire_input(messages: list[Message], model: str) -> list[dict[str, Any]]:
    """Our history as Responses input items."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "user":
            items.append(
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": str(message.get("content") or "")}],
                }
            )
        elif message["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": str(message.get("content") or ""),
                }
            )
        else:
            data = (message.get("provider_data") if message["role"] == "assistant" else None) or {}
            if data.get("model") == model:
                items.extend(data.get(_ITEMS_KEY) or [])
            if message.get("content"):
                items.append(
                    {"role": "assistant", "content": [{"type": "output_text", "text": message["content"]}]}
                )
            items.extend(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["function"]["name"],
                    "arguments": call["function"].get("arguments") or "{}",
                }
                for call in tool_calls_of(message)
            )
    return items


class CodexResponsesAdapter(WireAdapter):
    """The `codex_responses` API mode."""

    api_mode = "codex_responses"
    path = "/responses"

    def build_request(self, request: WireRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model,
            "stream": request.stream,
            "store": False,
            "include": ["reasoning.encrypted_content"],
        }
        if request.system_prompt:
            body["instructions"] = request.system_prompt
        if request.tools:
            body["tools"] = [
                {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
                for t in request.tools
            ]
            if not request.allow_tool_calls:
                body["tool_choice"] = "none"
        if request.max_tokens is not None:
            body["max_output_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        body["input"] = wire_input(request.messages, request.model)
        return body

    def parse_reply(self, data: Any) -> NormalizedResponse:
        if not isinstance(data, dict):
            raise malformed("a Responses API response", data)
        return normalize_output(data)

    def assembler(self, events: StreamEvents) -> ResponsesStreamAssembler:
        return ResponsesStreamAssembler(events)

    def request_options(self, timeout: float) -> dict[str, Any]:
        return {**super().request_options(timeout), "security": {"bearer_auth": True}}

    def finish_reply(self, reply: NormalizedResponse, body: dict[str, Any]) -> NormalizedResponse:
        if reply.provider_data:
            # Tag the reasoning with the model name we asked for (the reply names a dated snapshot), so a
            # later request to the same model replays it and a request to another model does not.
            reply.provider_data["model"] = body.get("model")
        return reply
