"""The Chat Completions adapter against real recorded OpenAI traffic and at the HTTP boundary."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from recorded import Collect, Replay, load_cassette

from mibyan.agent.adapters.base import CallHandle, EncodedList, WireRequest, encode_body
from mibyan.agent.adapters.chat_completions import ChatCompletionsAdapter
from mibyan.agent.messages import assistant_message, tool_message, user_message
from mibyan.core.errors import ProviderError
from mibyan.tools.schema import ToolSchema


def send(replay: Replay, body: dict, *, events: Collect | None = None):
    return ChatCompletionsAdapter().send(
        replay.openai_client(),
        body,
        stream=bool(body.get("stream")),
        events=events or Collect(),
        handle=CallHandle(),
        timeout=10,
    )


@pytest.mark.parametrize("recording", [0, 1])
def test_recorded_parallel_tool_call_stream_is_assembled_by_index(recording: int) -> None:
    interaction = load_cassette("chat_completions/openllmetry_tools_streaming_parallel.yaml")[recording]
    events = Collect()

    reply = send(Replay([interaction]), interaction.request_body, events=events)

    assert reply.finish_reason == "tool_calls"
    assert [c["function"]["name"] for c in reply.tool_calls] == ["get_current_weather"] * 2
    locations = [json.loads(c["function"]["arguments"])["location"] for c in reply.tool_calls]
    assert locations[0].startswith("San Francisco") and locations[1].startswith("Boston")
    assert all(c["id"].startswith("call_") for c in reply.tool_calls)
    assert events.tools == ["get_current_weather"] * 2


@pytest.mark.parametrize("recording", [0, 1])
def test_recorded_parallel_tool_calls_without_streaming(recording: int) -> None:
    interaction = load_cassette("chat_completions/openllmetry_tools_parallel_nonstreaming.yaml")[recording]

    reply = send(Replay([interaction]), interaction.request_body)

    assert reply.finish_reason == "tool_calls"
    assert len(reply.tool_calls) == 2
    assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0


def test_recorded_two_turn_tool_use_replays_the_same_wire_history() -> None:
    first, second = load_cassette("chat_completions/llm_tool_use_basic_streaming.yaml")
    replay = Replay([first, second])
    adapter = ChatCompletionsAdapter()
    tools = [
        ToolSchema(t["function"]["name"], t["function"].get("description", ""), t["function"]["parameters"])
        for t in first.request_body["tools"]
    ]
    prompt = first.request_body["messages"][-1]["content"]

    reply = send(replay, first.request_body)
    assert reply.finish_reason == "tool_calls"
    assert [c["function"]["name"] for c in reply.tool_calls] == ["multiply"]

    recorded_tool_result = second.request_body["messages"][-1]
    history = [
        user_message(prompt),
        assistant_message(reply.content, tool_calls=reply.tool_calls, reasoning="private thoughts"),
        tool_message(reply.tool_calls[0]["id"], recorded_tool_result["content"]),
    ]
    body = adapter.build_request(
        WireRequest(
            model=first.request_body["model"],
            system_prompt="",
            messages=history,
            tools=tools,
            stream=True,
            max_tokens=None,
            temperature=None,
        )
    )
    events = Collect()
    answer = send(replay, body, events=events)

    # The recording client sent an empty assistant message before the tool-call one; we send one
    # assistant message carrying the same call, which is what the alternation rule asks for.
    sent = replay.sent[1]["messages"]
    recorded_call = second.request_body["messages"][2]["tool_calls"][0]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    ours = sent[1]["tool_calls"][0]
    assert (ours["id"], ours["function"]["name"]) == (recorded_call["id"], recorded_call["function"]["name"])
    assert json.loads(ours["function"]["arguments"]) == json.loads(recorded_call["function"]["arguments"])
    assert sent[2] == recorded_tool_result
    assert "reasoning" not in sent[1]
    assert answer.finish_reason == "stop"
    assert answer.content == "".join(events.text) and answer.content
    assert answer.usage.input_tokens > 0, "the usage-only chunk after finish_reason was read"


def test_the_request_body_carries_system_tools_and_usage_option() -> None:
    body = ChatCompletionsAdapter().build_request(
        WireRequest(
            model="m",
            system_prompt="be brief",
            messages=[user_message("hi")],
            tools=[ToolSchema("t", "a tool", {"type": "object", "properties": {}})],
            stream=True,
            max_tokens=100,
            temperature=0.2,
        )
    )
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    assert body["tools"][0]["function"]["name"] == "t"
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 100 and body["temperature"] == 0.2


def test_the_sdk_sends_our_body_unchanged_with_the_bearer_key() -> None:
    seen = {}

    def handler(request):
        import httpx2

        seen["auth"] = request.headers["authorization"]
        seen["body"] = json.loads(request.content)
        return httpx2.Response(
            200, json={"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}
        )

    import httpx2
    import openai

    client = openai.OpenAI(
        api_key="sk-test",
        base_url="http://x/v1",
        http_client=openai.DefaultHttpxClient(transport=httpx2.MockTransport(handler)),
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo"}], "stream": False}
    reply = ChatCompletionsAdapter().send(
        client, body, stream=False, events=Collect(), handle=CallHandle(), timeout=5
    )
    assert seen == {"auth": "Bearer sk-test", "body": body}
    assert reply.content == "hi"


def test_a_reply_that_is_not_a_completion_is_a_malformed_reply() -> None:
    from recorded import Interaction

    replay = Replay([Interaction({}, 200, "application/json", b'{"unexpected": true}')])
    with pytest.raises(ProviderError) as caught:
        send(replay, {"model": "m", "messages": [], "stream": False})
    assert caught.value.reason == "malformed_reply"


def test_reasoning_content_is_captured_from_the_stream() -> None:
    from recorded import Interaction

    chunks = [
        {"choices": [{"index": 0, "delta": {"reasoning_content": "think "}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "hard"}}]},
        {"choices": [{"index": 0, "delta": {"content": "42"}, "finish_reason": "stop"}]},
    ]
    stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    events = Collect()
    reply = send(
        Replay([Interaction({}, 200, "text/event-stream", stream.encode())]),
        {"model": "m", "messages": [], "stream": True},
        events=events,
    )
    assert reply.reasoning == "think hard" and events.reasoning == ["think ", "hard"]
    assert reply.content == "42"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@given(
    before=st.dictionaries(st.text(max_size=6), _JSON, max_size=4),
    tools=st.lists(st.dictionaries(st.text(max_size=6), _JSON, max_size=3), max_size=3),
)
def test_a_body_with_its_tools_encoded_once_is_the_body_encoded_whole(before: dict, tools: list) -> None:
    """An agent's tools are encoded once and put in every request as text: what goes out parses to the
    very body, whatever else it holds (text needing escapes included)."""
    body = {**before, "tools": EncodedList(tools)}
    assert json.loads(encode_body(body)) == json.loads(json.dumps(body))


def test_the_tools_of_an_agent_are_encoded_once_for_all_its_requests() -> None:
    schemas = [ToolSchema("read", "Read a file «here»", {"type": "object", "properties": {}})]
    adapter = ChatCompletionsAdapter()
    bodies = [
        adapter.build_request(
            WireRequest(model="m", system_prompt="s", messages=[user_message(t)], tools=schemas)
        )
        for t in ("one", "two")
    ]
    assert bodies[0]["tools"][0] is bodies[1]["tools"][0]  # each tool made and encoded once
    sent = json.loads(encode_body(bodies[1]))
    assert sent == json.loads(json.dumps(bodies[1]))  # the text kept is what the parts say
    assert sent["tools"][0]["function"]["description"] == "Read a file «here»"
    assert [m["content"] for m in sent["messages"]] == ["s", "two"]
    # a history's messages are encoded once, and a message made anew is encoded anew
    history = [user_message("hi"), assistant_message("hello \u2028 «there»"), user_message("again")]
    first = adapter.build_request(WireRequest(model="m", system_prompt="", messages=history, tools=[]))
    again = adapter.build_request(
        WireRequest(model="m", system_prompt="", messages=[*history[:2], user_message("new")], tools=[])
    )
    assert first["messages"][1] is again["messages"][1]
    assert [m["content"] for m in json.loads(encode_body(again))["messages"]] == [
        "hi",
        "hello \u2028 «there»",
        "new",
    ]
