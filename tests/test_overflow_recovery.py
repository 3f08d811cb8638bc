"""A conversation that does not fit its window always finds a way: protect less, cut what is too big, or
say plainly what to do. It never stays stuck."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback import Reply, ScriptedServer

from mibyan.agent.messages import repair_history

WINDOW = 12_000
SUMMARY_MARK = "You compress the middle of a conversation"


def request_tokens(body: dict) -> float:
    return len(json.dumps(body["messages"]) + json.dumps(body.get("tools") or [])) / 4


class WindowedServer(ScriptedServer):
    """A model server that refuses any request larger than its window, as real ones do."""

    def __init__(self, window: int = WINDOW) -> None:
        super().__init__(default=self._answer)
        self.window = window

    def _answer(self, body: dict) -> Reply:
        if request_tokens(body) > self.window:
            message = f"This model's maximum context length is {self.window} tokens"
            return Reply(
                status=400, error_body={"error": {"message": message, "code": "context_length_exceeded"}}
            )
        if SUMMARY_MARK in json.dumps(body["messages"][:1]):
            return Reply(text="## Goal\nDiscuss the long texts.\n## Facts to remember\nnone\n")
        return Reply(text="answered")

    def agent_requests(self) -> list[dict]:
        return [s.body for s in self.requests if SUMMARY_MARK not in json.dumps(s.body["messages"][:1])]


@pytest.fixture
def windowed() -> Iterator[WindowedServer]:
    with WindowedServer() as server:
        yield server


def configure(home: Path, window: int = WINDOW) -> None:
    (home / "config.yaml").write_text(
        "agent: {api_max_retries: 0}\n"
        f"model: {{context_window: {window}}}\n"
        "compression: {protect_last_n: 20}\n"
    )


def big_history(messages: int = 12, chars: int = 11_000) -> list[dict]:
    history = []
    for i in range(messages):
        role = "user" if i % 2 == 0 else "assistant"
        history.append({"role": role, "content": f"text {i}: " + "lorem ipsum " * (chars // 12)})
    return history


def test_twelve_big_messages_all_protected_still_get_an_answer(
    windowed: WindowedServer, make_agent, home
) -> None:
    configure(home)
    agent = make_agent(base_url=windowed.base_url)

    result = agent.run_conversation("and now?", conversation_history=big_history())

    assert result["exit_reason"] == "completed", result["error"]
    assert result["final_response"] == "answered"
    assert repair_history(result["messages"])[1] == []
    assert result["messages"][-2]["content"] == "and now?"  # the prompt itself is kept whole


def test_the_session_is_not_stuck_after_an_overflow(windowed: WindowedServer, make_agent, home) -> None:
    configure(home)
    agent = make_agent(base_url=windowed.base_url)
    agent.run_conversation("first", conversation_history=big_history())

    later = [agent.run_conversation(f"question {n}")["exit_reason"] for n in range(3)]

    assert later == ["completed"] * 3
    last = windowed.agent_requests()[-1]
    assert request_tokens(last) <= WINDOW


def test_an_oversized_tool_result_in_the_current_turn_is_cut_and_its_pair_kept(
    windowed: WindowedServer, make_agent, home, tmp_path: Path
) -> None:
    configure(home)
    (tmp_path / "big.log").write_text("a line of the log\n" * 5000)  # 90 KB: more than the window
    windowed.add(Reply(tool_calls=[("read_file", {"path": str(tmp_path / "big.log")})]))

    result = make_agent(base_url=windowed.base_url).run_conversation("show me the output")

    assert result["exit_reason"] == "completed", result["error"]
    tool = next(m for m in result["messages"] if m["role"] == "tool")
    assert "cut to fit the context window" in tool["content"]
    assert repair_history(result["messages"])[1] == []
    assert all(request_tokens(body) <= WINDOW for body in windowed.agent_requests()[-1:])


def test_when_nothing_can_fit_the_error_says_what_to_do(make_agent, home) -> None:
    configure(home, window=200)  # the tools' descriptions alone are larger than this
    with WindowedServer(window=200) as tiny:
        result = make_agent(base_url=tiny.base_url).run_conversation("hello")

    assert result["exit_reason"] == "error"
    assert "/new" in result["error"]
    assert "model.context_window" in result["error"]
    assert repair_history(result["messages"])[1] == []
