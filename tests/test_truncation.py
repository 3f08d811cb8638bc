"""Replies cut at the token limit: a cut tool call is never run, whatever the API mode."""

from __future__ import annotations

from pathlib import Path

from loopback import Reply
from scripted_model import RawStream, ScriptedModel, sse


def anthropic_stream_cut_inside_a_tool_call(partial_arguments: str, stop_reason: str) -> RawStream:
    tool_use = {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {}}
    start = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "scripted"}
    usage = {"input_tokens": 9, "output_tokens": 8}
    return RawStream(
        [
            sse("message_start", {"type": "message_start", "message": {**start, "usage": usage}}),
            sse(
                "content_block_start", {"type": "content_block_start", "index": 0, "content_block": tool_use}
            ),
            sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": partial_arguments},
                },
            ),
            sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            sse(
                "message_delta",
                {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": usage},
            ),
            sse("message_stop", {"type": "message_stop"}),
        ]
    )


def test_an_anthropic_tool_call_cut_at_max_tokens_is_refused_not_retried(
    scripted: ScriptedModel, make_scripted_agent, tmp_path: Path
) -> None:
    target = tmp_path / "big.txt"
    cut = '{"path": "' + str(target) + '", "content": "line one\\nline tw'
    scripted.add(
        anthropic_stream_cut_inside_a_tool_call(cut, "max_tokens"), Reply(text="I will write it in parts")
    )

    result = make_scripted_agent(api_mode="anthropic_messages").run_conversation("write the big file")

    assert result["final_response"] == "I will write it in parts"
    assert result["api_calls"] == 2  # the cut reply, then the next one: no retry of the cut reply
    assert not target.exists()
    call, answer = [m for m in result["messages"] if m["role"] in ("assistant", "tool")][:2]
    assert call["tool_calls"][0]["function"]["arguments"] == cut
    assert "cut off at the reply length limit" in answer["content"]


def test_broken_tool_arguments_without_a_token_limit_are_a_malformed_reply(
    scripted: ScriptedModel, make_scripted_agent
) -> None:
    scripted.add(anthropic_stream_cut_inside_a_tool_call('{"path": ', "tool_use"))

    result = make_scripted_agent(api_mode="anthropic_messages").run_conversation("write")

    assert result["exit_reason"] == "error"
    assert "is not a tool call with JSON arguments" in result["error"]
