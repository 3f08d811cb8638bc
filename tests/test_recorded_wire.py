"""Anthropic Messages and OpenAI Responses against real recorded traffic, through the real SDKs."""

from __future__ import annotations

import json

import pytest
from recorded import Collect, Interaction, Replay, load_cassette

from mibyan.agent.adapters.anthropic_messages import AnthropicMessagesAdapter
from mibyan.agent.adapters.base import CallHandle, WireRequest
from mibyan.agent.adapters.codex_responses import CodexResponsesAdapter
from mibyan.agent.messages import tool_message, user_message
from mibyan.agent.turn_api_error import classify_error
from mibyan.tools.schema import ToolSchema


def send(adapter, client, body: dict, events: Collect | None = None):
    return adapter.send(
        client,
        body,
        stream=bool(body.get("stream")),
        events=events or Collect(),
        handle=CallHandle(),
        timeout=10,
    )


def schemas(tools: list[dict]) -> list[ToolSchema]:
    return [
        ToolSchema(t["name"], t.get("description", ""), t.get("input_schema") or t.get("parameters") or {})
        for t in tools
    ]


# -- Anthropic Messages ------------------------------------------------------------------------------


def test_anthropic_thinking_signature_is_replayed_unchanged() -> None:
    first, second = load_cassette("anthropic_messages/llm_anthropic_thinking_tool_chain_streaming.yaml")
    replay = Replay([first, second])
    adapter = AnthropicMessagesAdapter(thinking_budget=1024)
    events = Collect()

    reply = send(adapter, replay.anthropic_client(), first.request_body, events)

    assert reply.finish_reason == "tool_calls"
    assert [c["function"]["name"] for c in reply.tool_calls] == ["fixed_version"]
    assert json.loads(reply.tool_calls[0]["function"]["arguments"]) == {}
    assert reply.reasoning.startswith("The user wants me to")
    assert "".join(events.reasoning) == reply.reasoning
    recorded_assistant = second.request_body["messages"][1]["content"]
    recorded_result = second.request_body["messages"][2]["content"][0]

    history = [
        user_message(first.request_body["messages"][0]["content"][0]["text"]),
        reply.as_message(),
        tool_message(reply.tool_calls[0]["id"], recorded_result["content"]),
    ]
    body = adapter.build_request(
        WireRequest(
            model=first.request_body["model"],
            system_prompt="",
            messages=history,
            tools=schemas(first.request_body["tools"]),
            stream=True,
            max_tokens=64000,
            temperature=None,
        )
    )
    sent_blocks = body["messages"][1]["content"]
    assert sent_blocks[0] == recorded_assistant[0]  # the signed thinking block, byte for byte
    assert sent_blocks[1] == recorded_assistant[1]
    assert body["messages"][2]["content"][0] == {**recorded_result, "type": "tool_result"}

    answer = send(adapter, replay.anthropic_client(), body)
    assert answer.finish_reason == "stop" and "0.32a0" in answer.content


def test_anthropic_parallel_tool_use_stream() -> None:
    (interaction,) = load_cassette("anthropic_messages/openllmetry_tools_streaming_parallel.yaml")
    events = Collect()
    reply = send(
        AnthropicMessagesAdapter(), Replay([interaction]).anthropic_client(), interaction.request_body, events
    )
    assert reply.content and reply.content == "".join(events.text)
    assert [c["function"]["name"] for c in reply.tool_calls] == ["get_weather", "get_time"]
    assert json.loads(reply.tool_calls[0]["function"]["arguments"])["location"].startswith("San Francisco")
    assert all(json.loads(c["function"]["arguments"]) for c in reply.tool_calls)
    assert reply.finish_reason == "tool_calls"
    assert reply.usage.input_tokens == 506 and reply.usage.output_tokens > 5


def test_anthropic_parallel_tool_use_without_streaming() -> None:
    (interaction,) = load_cassette("anthropic_messages/openllmetry_tools_parallel_nonstreaming.yaml")
    reply = send(
        AnthropicMessagesAdapter(), Replay([interaction]).anthropic_client(), interaction.request_body
    )
    assert reply.content.startswith("Certainly!")
    assert [c["function"]["name"] for c in reply.tool_calls] == ["get_weather", "get_time"]
    assert reply.finish_reason == "tool_calls"


# -- OpenAI Responses --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cassette", ["responses/llm_tool_use_streaming.yaml", "responses/llm_tool_use_nonstreaming.yaml"]
)
def test_responses_tool_use_round_trip(cassette: str) -> None:
    first, second = load_cassette(cassette)
    replay = Replay([first, second])
    adapter = CodexResponsesAdapter()
    model = first.request_body["model"]

    reply = send(adapter, replay.openai_client(), first.request_body)
    assert [c["function"]["name"] for c in reply.tool_calls] == ["multiply"]
    assert json.loads(reply.tool_calls[0]["function"]["arguments"]) == {"a": 1231, "b": 2331}

    history = [
        user_message(first.request_body["input"][0]["content"]),
        reply.as_message(),
        tool_message(reply.tool_calls[0]["id"], "2869461"),
    ]
    body = adapter.build_request(
        WireRequest(
            model=model,
            system_prompt="",
            messages=history,
            tools=schemas(first.request_body["tools"]),
            stream=bool(first.request_body["stream"]),
            max_tokens=None,
            temperature=None,
        )
    )
    recorded_call, recorded_output = second.request_body["input"][-2:]
    sent_call, sent_output = body["input"][-2:]
    assert (sent_call["call_id"], sent_call["name"]) == (recorded_call["call_id"], recorded_call["name"])
    assert sent_output == recorded_output

    answer = send(adapter, replay.openai_client(), body)
    assert answer.finish_reason == "stop" and "2,869,461" in answer.content.replace("2869461", "2,869,461")


def test_responses_stream_with_reasoning_keeps_the_encrypted_item() -> None:
    (interaction,) = load_cassette("responses/pydantic_ai_streaming_reasoning_function_call.yaml")
    reply = send(CodexResponsesAdapter(), Replay([interaction]).openai_client(), interaction.request_body)

    assert [c["function"]["name"] for c in reply.tool_calls] == ["final_result"]
    assert isinstance(json.loads(reply.tool_calls[0]["function"]["arguments"])["result"], int)
    items = reply.provider_data["responses_reasoning"]
    assert items[0]["encrypted_content"].startswith("gAAAA")
    assert reply.usage.reasoning_tokens > 0


def test_responses_interleaved_reasoning_is_sent_back_in_order_unchanged() -> None:
    turns = load_cassette("responses/llm_interleaved_reasoning_between_tool_calls.yaml")
    adapter = CodexResponsesAdapter()
    model = turns[0].request_body["model"]
    history = [user_message(turns[0].request_body["input"][0]["content"])]
    replay = Replay(turns)
    reply = None
    for index, turn in enumerate(turns):
        body = adapter.build_request(
            WireRequest(
                model=model,
                system_prompt="",
                messages=history,
                tools=schemas(turns[0].request_body["tools"]),
                stream=False,
                max_tokens=None,
                temperature=None,
            )
        )
        if index:
            recorded = turn.request_body["input"]
            assert [i.get("type", i.get("role")) for i in body["input"]] == [
                i.get("type", i.get("role")) for i in recorded
            ]
            for ours, theirs in zip(body["input"], recorded, strict=True):
                if theirs.get("type") == "reasoning":
                    assert (
                        ours["encrypted_content"] == theirs["encrypted_content"]
                        and ours["id"] == theirs["id"]
                    )
        reply = send(adapter, replay.openai_client(), body)
        history.append(reply.as_message())
        outputs = turns[index + 1].request_body["input"] if index + 1 < len(turns) else []
        results = {i["call_id"]: i["output"] for i in outputs if i.get("type") == "function_call_output"}
        history.extend(tool_message(c["id"], results.get(c["id"], "?")) for c in reply.tool_calls)
    assert len(reply.tool_calls) == 5


# -- recorded error bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cassette", "client", "reason"),
    [
        ("errors/openai_chat_401_invalid_api_key.yaml", "openai", "auth"),
        ("errors/openai_chat_404_model_not_found.yaml", "openai", "bad_request"),
        ("errors/openai_responses_400_model_not_found.yaml", "openai", "bad_request"),
        ("errors/anthropic_400_invalid_request_error.yaml", "anthropic", "bad_request"),
        ("errors/anthropic_404_not_found_error.yaml", "anthropic", "bad_request"),
    ],
)
def test_recorded_errors_are_classified(cassette: str, client: str, reason: str) -> None:
    interactions = load_cassette(cassette)
    for interaction in interactions:
        replay = Replay(
            [Interaction(interaction.request_body, interaction.status, "application/json", interaction.body)]
        )
        sdk = replay.anthropic_client() if client == "anthropic" else replay.openai_client()
        adapter = (
            AnthropicMessagesAdapter()
            if client == "anthropic"
            else (CodexResponsesAdapter() if "responses" in cassette else None)
        )
        if adapter is None:
            from mibyan.agent.adapters.chat_completions import ChatCompletionsAdapter

            adapter = ChatCompletionsAdapter()
        with pytest.raises(Exception) as caught:
            send(adapter, sdk, {**interaction.request_body, "stream": False})
        error = classify_error(caught.value)
        assert error.reason == reason
        assert error.status == interaction.status
