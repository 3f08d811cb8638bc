"""Local models (llama.cpp, Ollama) behave like hosted ones.

A local model on a CPU reads a long prompt for many seconds before its first token; a call mibyan gives up
on must hang up, or the server goes on generating for nobody; its context-exceeded 500 is an overflow.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_in_background
from loopback import Reply, ScriptedServer
from test_context import is_summary_request, long_history

from agent_state import SessionStore

#: How long the scripted server stays silent before it answers: longer than the stall timeout below.
READING_THE_PROMPT = 0.8


@pytest.fixture
def impatient_home(home: Path) -> Path:
    """A stall timeout far below the model's first-token wait, a generous api_timeout, retries allowed."""
    (home / "config.yaml").write_text(
        "agent: {stream_stall_timeout: 0.3, api_timeout: 30, api_max_retries: 2, max_retry_wait: 0.05}\n"
    )
    return home


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
def test_a_first_token_slower_than_the_stall_timeout_is_waited_for_without_a_retry(
    server: ScriptedServer, make_agent, impatient_home: Path, stream: bool
) -> None:
    server.add(Reply(text="read it all", delay=READING_THE_PROMPT))

    result = make_agent(home=impatient_home, stream=stream).run_conversation("a long prompt")

    assert result["exit_reason"] == "completed", result["error"]
    assert result["final_response"] == "read it all"
    assert len(server.requests) == 1
    assert server.hangups == 0


def test_silence_after_the_stream_opened_but_before_the_first_token_is_not_a_stall(
    server: ScriptedServer, make_agent, impatient_home: Path
) -> None:
    # Some servers send the headers and an empty first chunk (its role) at once, then read the prompt.
    server.add(Reply(text="read it all", stall=READING_THE_PROMPT, stall_after=0))

    result = make_agent(home=impatient_home).run_conversation("a long prompt")

    assert result["final_response"] == "read it all"
    assert len(server.requests) == 1 and server.hangups == 0


def test_a_flowing_answer_that_goes_silent_is_cut_and_retried(
    server: ScriptedServer, make_agent, impatient_home: Path
) -> None:
    server.add(Reply(text="this answer stops here", chunks=4, stall=30), Reply(text="second try"))

    result = make_agent(home=impatient_home).run_conversation("hi")

    assert result["final_response"] == "second try"
    assert len(server.requests) == 2
    assert server.wait_for_hangups(1), "the stalled connection was left open"


def test_a_call_past_api_timeout_hangs_up(server: ScriptedServer, make_agent, home: Path) -> None:
    (home / "config.yaml").write_text("agent: {api_timeout: 0.3, api_max_retries: 0}\n")
    server.add(Reply(text="too late", delay=30))

    result = make_agent(stream=False).run_conversation("hi")

    assert result["exit_reason"] == "error"
    assert "timed out" in result["error"]
    assert server.wait_for_hangups(1), "the server would go on generating for nobody"


def test_an_interrupted_plain_call_hangs_up(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(text="too late", delay=30))
    agent = make_agent(stream=False)
    worker, outcome = run_in_background(agent, "take your time")
    assert server.wait_for_requests(1)

    agent.interrupt()
    worker.join(10)

    assert outcome["exit_reason"] == "interrupted"
    assert server.wait_for_hangups(1), "the server would go on generating for nobody"


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (500, "Context size has been exceeded."),  # llama.cpp, its shared context full
        (400, "request (9000 tokens) exceeds the available context size (8192 tokens), try increasing it"),
        (500, "input length exceeds maximum context length"),  # Ollama
        (500, "prompt too long; exceeded max context length by 310 tokens"),  # Ollama
    ],
    ids=["llama.cpp-500", "llama.cpp-400", "ollama-input", "ollama-prompt"],
)
def test_a_local_servers_context_exceeded_error_is_an_overflow_compressed_and_retried(
    server: ScriptedServer, make_agent, home: Path, status: int, message: str
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 2, max_retry_wait: 0.05}\n")
    server.add(Reply(status=status, error_body={"error": {"code": status, "message": message}}))
    server.default = lambda body: Reply(text="summary") if is_summary_request(body) else Reply(text="fits")

    result = make_agent().run_conversation("next", conversation_history=long_history(rounds=40))

    assert result["final_response"] == "fits"
    assert len(server.requests) == 3  # the overflow, the summary, the smaller retry: no plain retry
    assert len(server.requests[2].body["messages"]) < len(server.requests[0].body["messages"])


CALL = '{"name": "read_file", "arguments": {"path": "notes.txt"}}'


@pytest.mark.parametrize(
    ("written", "text_left"),
    [
        (f"Let me look.\n<tool_call>\n{CALL}\n</tool_call>", "Let me look."),
        (f"<tool_call>{CALL}", None),  # the closing tag left out, as small models do
        (CALL, None),
        (f"[{CALL}]", None),
        ('<function=read_file>{"path": "notes.txt"}</function>', None),
        ('{"name": "read_file", "parameters": "{\\"path\\": \\"notes.txt\\"}"}', None),
    ],
    ids=["hermes", "hermes-unclosed", "bare-json", "json-list", "function-tag", "parameters-string"],
)
def test_a_tool_call_written_as_text_runs_and_is_stored_as_a_structured_call(
    server: ScriptedServer, make_agent, home: Path, tmp_path: Path, written: str, text_left: str | None
) -> None:
    (tmp_path / "notes.txt").write_text("the word is heron\n")
    server.add(Reply(text=written), Reply(text="It says heron."))

    result = make_agent().run_conversation("what is in notes.txt?")

    assert result["final_response"] == "It says heron."
    (tool_result,) = [m for m in server.requests[1].body["messages"] if m["role"] == "tool"]
    assert "heron" in tool_result["content"]
    stored = SessionStore.open(home).load_messages(result["session_id"])
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    (call,) = stored[1]["tool_calls"]
    assert call["function"]["name"] == "read_file"
    assert json.loads(call["function"]["arguments"]) == {"path": "notes.txt"}
    assert stored[1]["content"] == text_left
    assert stored[2]["tool_call_id"] == call["id"]


@pytest.mark.parametrize(
    "written",
    [
        f"Call it like this:\n\n```\n<tool_call>\n{CALL}\n</tool_call>\n```\n",
        f"Write `<tool_call>{CALL}</tool_call>` to read a file.",
        '<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "read_file", "arguments": {path: notes.txt}}</tool_call>',
        '{"name": "read_file", "arguments": {"path": "notes.txt"}, "why": "curious"}',
    ],
    ids=["fenced", "inline-code", "unknown-tool", "invalid-json", "other-keys"],
)
def test_tool_call_syntax_that_is_quoted_or_invalid_stays_text_and_runs_nothing(
    server: ScriptedServer, make_agent, tmp_path: Path, written: str
) -> None:
    (tmp_path / "notes.txt").write_text("the word is heron\n")
    server.add(Reply(text=written))

    result = make_agent().run_conversation("how do I read a file?")

    assert result["final_response"] == written
    assert len(server.requests) == 1
    assert not any(m.get("tool_calls") for m in result["messages"])
