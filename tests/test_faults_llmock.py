"""Fault injection with llmock, a real LLM server on loopback that breaks on demand.

Each fault ends in a completed answer (after a retry) or in one clear error, never in a hang, a traceback
or a broken history.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_cli

from mibyan.agent.messages import repair_history


@pytest.fixture
def agent_on(llmock, home: Path):
    from run_agent import AIAgent

    (home / "config.yaml").write_text(
        "agent: {api_max_retries: 2, stream_stall_timeout: 0.5, max_retry_wait: 0.1}\n"  # short back-off
    )
    llmock.tool_mode("off")

    def make(**kwargs):
        return AIAgent(base_url=llmock.base_url("openai"), api_key="k", home=home, **kwargs)

    return make


FAULTS = {
    "429 with retry-after": lambda m: m.rate_limit(retry_after=0.1),
    "500": lambda m: m.fail(500),
    "503": lambda m: m.fail(503),
    "529": lambda m: m.fail(529),
    # after its first piece of text: the silence before it (reading the prompt) is not a stall
    "stall past the stall timeout": lambda m: m.stall(after_chunks=2, seconds=3),
    "mid-stream disconnect": lambda m: m.disconnect(after_chunks=1),
    "clean early end of stream": lambda m: m.truncate(after_chunks=1),
    "malformed chunk": lambda m: m.corrupt(after_chunks=1),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_transient_fault_ends_in_a_completed_answer(llmock, agent_on, fault: str) -> None:
    FAULTS[fault](llmock)
    llmock.reply("all good")

    result = agent_on().run_conversation("hello")

    assert result["exit_reason"] == "completed", result["error"]
    assert result["final_response"]
    assert repair_history(result["messages"])[1] == []
    assert len(llmock.requests) >= 2


def test_broken_tool_call_arguments_go_back_to_the_model(llmock, agent_on) -> None:
    llmock.tool_mode("auto")
    llmock.break_tool_call("malformed_arguments")
    llmock.reply("I will fix my call")

    result = agent_on().run_conversation("use a tool")

    tool_results = [m["content"] for m in result["messages"] if m["role"] == "tool"]
    assert tool_results and tool_results[0].startswith("error:")
    assert result["exit_reason"] == "completed"


def test_a_provider_that_stays_down_is_one_clear_error(llmock, home: Path) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 1, max_retry_wait: 0.2}\n")
    llmock.outage(status=503)
    done = run_cli(
        "chat", "-q", "hi", "--base-url", llmock.base_url("openai"), home=home, env={"OPENAI_API_KEY": "k"}
    )
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) <= 3
    assert done.stderr.strip().splitlines()[-1].startswith("mibyan: HTTP 503")
    assert "Traceback" not in done.stderr
