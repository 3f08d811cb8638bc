"""The three API modes end to end on loopback, and the resolution of the mode."""

from __future__ import annotations

import itertools
import json

import pytest
from loopback import Reply, ScriptedServer

from mibyan.agent.messages import repair_history
from mibyan.agent.providers import resolve_api_mode
from mibyan.core.errors import ConfigError

MODES = ["chat_completions", "codex_responses", "anthropic_messages"]


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_five_parallel_tool_rounds_complete_in_every_mode(
    server: ScriptedServer, make_agent, mode, stream
) -> None:
    for _ in range(5):
        server.add(
            Reply(
                tool_calls=[("list_directory", {"path": "."}), ("search_files", {"glob": "*.txt"})],
                reasoning="thinking about it",
            )
        )
    server.add(Reply(text="Five rounds done.", reasoning="that was enough"))
    agent = make_agent(base_url=server.url_for(mode), api_mode=mode, stream=stream)

    result = agent.run_conversation("go five times")

    assert result["exit_reason"] == "completed", result["error"]
    assert result["final_response"] == "Five rounds done."
    assert [m["role"] for m in result["messages"]] == ["user"] + ["assistant", "tool", "tool"] * 5 + [
        "assistant"
    ]
    assert result["messages"][1]["reasoning"].startswith("thinking about it")
    assert result["usage"]["input_tokens"] == 60 and result["usage"]["output_tokens"] == 30
    assert len(server.requests) == 6
    assert repair_history(result["messages"])[1] == []


def test_anthropic_requests_pair_tool_results_and_replay_thinking(server: ScriptedServer, make_agent) -> None:
    server.add(
        Reply(tool_calls=[("list_directory", {}), ("list_directory", {"path": "/"})], reasoning="hmm"),
        Reply(text="done"),
    )
    make_agent(base_url=server.root_url, api_mode="anthropic_messages").run_conversation("list twice")

    second = server.requests[1].body
    assert second["system"][0]["type"] == "text"
    assistant, results = second["messages"][1], second["messages"][2]
    assert [b["type"] for b in assistant["content"]] == ["thinking", "tool_use", "tool_use"]
    assert assistant["content"][0] == {"type": "thinking", "thinking": "hmm", "signature": "sig-hmm"}
    assert results["role"] == "user"
    assert [b["type"] for b in results["content"]] == ["tool_result", "tool_result"]
    assert [b["tool_use_id"] for b in results["content"]] == [b["id"] for b in assistant["content"][1:]]


def test_responses_requests_are_stateless_and_replay_encrypted_reasoning(
    server: ScriptedServer, make_agent
) -> None:
    server.add(Reply(tool_calls=[("list_directory", {})], reasoning="plan"), Reply(text="done"))
    make_agent(api_mode="codex_responses", model="scripted").run_conversation("list")

    first, second = server.requests[0].body, server.requests[1].body
    assert first["store"] is False and first["include"] == ["reasoning.encrypted_content"]
    assert "instructions" in first
    kinds = [item.get("type", item.get("role")) for item in second["input"]]
    assert kinds == ["user", "reasoning", "function_call", "function_call_output"]
    assert second["input"][1]["encrypted_content"] == "enc-plan"


def test_reasoning_from_another_model_is_not_replayed(server: ScriptedServer, make_agent) -> None:
    server.add(
        Reply(tool_calls=[("list_directory", {})], reasoning="plan"), Reply(text="done"), Reply(text="again")
    )
    first = make_agent(api_mode="codex_responses", model="model-a").run_conversation("list")
    assert any(i.get("type") == "reasoning" for i in server.requests[1].body["input"])

    make_agent(api_mode="codex_responses", model="model-b", session_id=first["session_id"]).chat("and now?")

    assert not any(i.get("type") == "reasoning" for i in server.requests[2].body["input"])
    assert [i.get("type", i.get("role")) for i in server.requests[2].body["input"]] == [
        "user",
        "function_call",
        "function_call_output",
        "assistant",
        "user",
    ]


def test_anthropic_prefix_is_byte_identical_up_to_the_last_cache_breakpoint(
    server: ScriptedServer, make_agent
):
    server.default = lambda body: Reply(text=f"answer {len(body['messages'])}")
    agent = make_agent(base_url=server.root_url, api_mode="anthropic_messages")
    for turn in range(10):
        agent.chat(f"question {turn}")

    marker = ',"cache_control":{"type":"ephemeral"}'
    bodies = [json.dumps(seen.body, separators=(",", ":")) for seen in server.requests]
    for before, after in itertools.pairwise(bodies):
        last_breakpoint = before.rindex(marker)
        assert after[:last_breakpoint] == before[:last_breakpoint]
    for body in bodies:
        assert body.count("cache_control") <= 4
    last = server.requests[-1].body
    assert "cache_control" in last["tools"][-1] and "cache_control" in last["system"][-1]
    assert "cache_control" in last["messages"][-1]["content"][-1]


def test_anthropic_cache_tokens_are_counted(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(text="cached", usage={"prompt_tokens": 5, "completion_tokens": 2}))
    agent = make_agent(base_url=server.root_url, api_mode="anthropic_messages", stream=False)
    result = agent.run_conversation("hi")
    assert result["usage"]["input_tokens"] == 5 and result["usage"]["output_tokens"] == 2


def test_explicit_api_mode_wins() -> None:
    assert (
        resolve_api_mode("codex_responses", "anthropic_messages", "https://api.anthropic.com")
        == "codex_responses"
    )


def test_the_providers_configured_mode_comes_next() -> None:
    assert resolve_api_mode(None, "anthropic_messages", "http://127.0.0.1:8080/v1") == "anthropic_messages"


@pytest.mark.parametrize("url", ["https://api.anthropic.com", "https://gateway.example.com/proxy/anthropic"])
def test_anthropic_base_urls_select_anthropic_messages(url: str) -> None:
    assert resolve_api_mode(None, None, url) == "anthropic_messages"


def test_chat_completions_is_the_default() -> None:
    assert resolve_api_mode(None, None, "https://openrouter.ai/api/v1") == "chat_completions"


def test_an_unknown_explicit_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown API mode"):
        resolve_api_mode("smoke_signals", None, None)


@pytest.mark.parametrize("mode", MODES)
def test_a_reasoning_only_reply_is_asked_again(server: ScriptedServer, make_agent, mode: str) -> None:
    server.add(Reply(reasoning="just thinking"), Reply(text="here it is"))
    result = make_agent(base_url=server.url_for(mode), api_mode=mode).run_conversation("answer")
    assert result["final_response"] == "here it is"
    assert [m["role"] for m in result["messages"]] == ["user", "assistant"]


def test_three_reasoning_only_replies_end_the_attempt(server: ScriptedServer, make_agent) -> None:
    server.default = lambda body: Reply(reasoning="still thinking")
    result = make_agent(api_mode="codex_responses").run_conversation("answer")
    assert result["exit_reason"] == "error"
    assert "only reasoning 3 times in a row" in result["error"]
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    ("mode", "choice"),
    [("chat_completions", "none"), ("codex_responses", "none"), ("anthropic_messages", {"type": "none"})],
)
def test_the_budget_summary_describes_tools_but_forbids_calling_them(
    server: ScriptedServer, make_agent, mode, choice
):
    server.default = lambda body: Reply(tool_calls=[("list_directory", {})], text="summary")
    result = make_agent(base_url=server.url_for(mode), api_mode=mode, max_iterations=2).run_conversation(
        "loop"
    )
    last = server.requests[-1].body
    assert result["exit_reason"] == "budget_exhausted"
    assert last["tools"] and last["tool_choice"] == choice
    assert repair_history(result["messages"])[1] == []


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_the_reasoning_callback_gets_the_whole_reasoning_streamed_or_not(
    server: ScriptedServer, make_agent, mode, stream
) -> None:
    server.add(Reply(text="Yes.", reasoning="the user asked a yes-or-no question"))
    pieces: list[str] = []
    agent = make_agent(
        base_url=server.url_for(mode), api_mode=mode, stream=stream, reasoning_callback=pieces.append
    )

    result = agent.run_conversation("is it?")

    assert result["final_response"] == "Yes."
    assert "".join(pieces) == "the user asked a yes-or-no question"
