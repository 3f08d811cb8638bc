"""The agent loop against a real Chat Completions server on loopback, through the public API."""

from __future__ import annotations

import pytest
from conftest import run_in_background
from loopback import Reply, ScriptedServer

from mibyan.agent.messages import repair_history


def assert_valid_request(body: dict) -> None:
    messages = body["messages"]
    assert messages[0]["role"] == "system"
    _, problems = repair_history(messages[1:])
    assert problems == []
    assert all("reasoning" not in m and "provider_data" not in m for m in messages)


@pytest.mark.parametrize("stream", [True, False])
def test_five_tool_rounds_then_text_completes(server: ScriptedServer, make_agent, stream: bool) -> None:
    for _ in range(5):
        server.add(Reply(tool_calls=[("list_directory", {"path": "."})]))
    server.add(Reply(text="Done: five listings."))
    agent = make_agent(stream=stream)

    result = agent.run_conversation("list it five times")

    assert result["completed"] is True
    assert result["exit_reason"] == "completed"
    assert result["final_response"] == "Done: five listings."
    assert result["messages"][-1] == {"role": "assistant", "content": "Done: five listings."}
    assert result["api_calls"] == 6
    assert result["usage"]["input_tokens"] == 60
    assert result["usage"]["output_tokens"] == 30
    assert len(server.requests) == 6
    for seen in server.requests:
        assert seen.body["stream"] is stream
        assert_valid_request(seen.body)
    roles = [m["role"] for m in result["messages"]]
    assert roles == ["user"] + ["assistant", "tool"] * 5 + ["assistant"]


def test_parallel_tool_results_keep_the_models_order(server: ScriptedServer, make_agent, tmp_path) -> None:
    (tmp_path / "a.txt").write_text("alpha\n")
    (tmp_path / "b.txt").write_text("beta\n")
    server.add(
        Reply(
            tool_calls=[
                ("read_file", {"path": str(tmp_path / "a.txt")}),
                ("read_file", {"path": str(tmp_path / "b.txt")}),
                ("no_such_tool", {}),
            ]
        ),
        Reply(text="ok"),
    )

    result = make_agent().run_conversation("read both")

    tools = [m for m in result["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["call_1", "call_2", "call_3"]
    assert "alpha" in tools[0]["content"] and "beta" in tools[1]["content"]
    assert tools[2]["content"].startswith("error: unknown tool")
    assert_valid_request(server.requests[1].body)


def test_streamed_text_reaches_the_callback_in_order(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(text="one two three four five six", chunks=6))
    pieces: list[str] = []

    result = make_agent(stream_delta_callback=pieces.append).run_conversation("count")

    assert len(pieces) == 6
    assert "".join(pieces) == "one two three four five six" == result["final_response"]


def test_a_stream_cut_before_finish_reason_is_an_error_not_an_answer(
    server: ScriptedServer, make_agent
) -> None:
    server.add(Reply(text="half an answ", cut=True))

    result = make_agent().run_conversation("hi")

    assert result["exit_reason"] == "error"
    assert result["completed"] is False
    assert result["final_response"] is None
    # the server hangs up in the middle of the chunked body: a dropped connection, never a clean end
    assert "the connection dropped mid-stream" in result["error"]
    assert [m["role"] for m in result["messages"]] == ["user"]


def test_a_dropped_stream_is_retried(server: ScriptedServer, make_agent, home) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 1, max_retry_wait: 0.1}\n")  # short back-off
    server.add(Reply(text="half", cut=True), Reply(text="whole answer"))
    statuses: list[tuple[str, str]] = []

    result = make_agent(status_callback=lambda kind, msg: statuses.append((kind, msg))).run_conversation("hi")

    assert result["final_response"] == "whole answer"
    assert [kind for kind, _ in statuses] == ["retry", "stream_restart"]  # "half" is not how it begins


def test_interrupt_during_a_slow_reply_returns_at_once(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(text="too late", delay=30))
    agent = make_agent()
    worker, outcome = run_in_background(agent, "take your time")
    assert server.wait_for_requests(1)

    agent.interrupt()
    worker.join(5)  # the reply is 30 s away: returning before means the call was abandoned

    assert not worker.is_alive()
    assert outcome["interrupted"] is True
    assert outcome["exit_reason"] == "interrupted"
    assert [m["role"] for m in outcome["messages"]] == ["user"]

    server.add(Reply(text="back again"))
    follow_up = agent.run_conversation("are you there?")
    assert follow_up["final_response"] == "back again"
    assert_valid_request(server.requests[-1].body)
    assert server.wait_for_hangups(1), "the abandoned connection was left open"


def test_interrupt_from_a_callback_mid_stream_keeps_no_partial_reply(
    server: ScriptedServer, make_agent
) -> None:
    server.add(Reply(text="a long streamed answer that gets cut", chunks=8))
    agent = make_agent()
    agent.callbacks.stream_delta_callback = lambda _text: agent.interrupt()

    result = agent.run_conversation("stream please")

    assert result["interrupted"] is True
    assert [m["role"] for m in result["messages"]] == ["user"]


def test_budget_exhausted_makes_one_summary_call_without_tools(server: ScriptedServer, make_agent) -> None:
    server.default = lambda body: Reply(tool_calls=[("list_directory", {"path": "."})], text="summary")

    result = make_agent(max_iterations=3).run_conversation("loop forever")

    assert result["exit_reason"] == "budget_exhausted"
    assert result["completed"] is False
    assert len(server.requests) == 4
    assert all("tool_choice" not in seen.body for seen in server.requests[:3])
    assert server.requests[3].body["tool_choice"] == "none"
    assert result["final_response"] == "summary"
    assert result["messages"][-1]["role"] == "assistant"
    assert "tool_calls" not in result["messages"][-1]
    assert sum(1 for m in result["messages"] if m["role"] == "tool") == 3
    for seen in server.requests:
        assert_valid_request(seen.body)


def test_a_callback_that_raises_does_not_break_the_turn(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(tool_calls=[("list_directory", {})]), Reply(text="fine"))

    def broken(*_args: object) -> None:
        raise RuntimeError("display bug")

    agent = make_agent(stream_delta_callback=broken, tool_progress_callback=broken, step_callback=broken)
    assert agent.chat("go") == "fine"


def test_unknown_callback_names_are_rejected(home) -> None:
    from run_agent import AIAgent

    with pytest.raises(TypeError, match="stream_callback"):
        AIAgent(base_url="http://127.0.0.1:9/v1", home=home, stream_callback=print)


def test_chat_returns_the_final_answer_and_keeps_the_session(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(text="first"), Reply(text="second"))
    agent = make_agent()

    assert agent.chat("one") == "first"
    assert agent.chat("two") == "second"
    assert [m["role"] for m in server.requests[1].body["messages"]] == ["system", "user", "assistant", "user"]


def test_server_errors_end_the_turn_with_a_clear_error(server: ScriptedServer, make_agent) -> None:
    server.add(
        Reply(
            status=401,
            error_body={
                "error": {
                    "message": "Incorrect API key provided",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
        )
    )

    result = make_agent().run_conversation("hi")

    assert result["exit_reason"] == "error"
    assert "401" in result["error"] and "Incorrect API key" in result["error"]


def test_the_callback_names_mypy_checks_are_the_callbacks_an_agent_takes() -> None:
    from dataclasses import fields
    from typing import get_args

    from mibyan.agent.callbacks import CallbackName, Callbacks

    assert set(get_args(CallbackName)) == {field.name for field in fields(Callbacks)}
