"""Subagents (delegate_task) and the todo list."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from loopback import Reply, ScriptedServer

from agent_state import SessionStore
from mibyan.agent.messages import repair_history


def first_user(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def is_child(body: dict) -> bool:
    return first_user(body).startswith("Task: ")


def script(rounds: int, delay: float = 0.0, tasks: int = 3):
    def reply(body: dict) -> Reply:
        tools = sum(1 for m in body["messages"] if m["role"] == "tool")
        if is_child(body):
            if tools < rounds:
                return Reply(tool_calls=[("list_directory", {})], delay=delay)
            return Reply(text=f"report on {first_user(body)[6:]}", delay=delay)
        if tools == 0:
            return Reply(
                tool_calls=[("delegate_task", {"tasks": [{"goal": f"area {i}"} for i in range(tasks)]})]
            )
        return Reply(text="all areas covered")

    return reply


def test_three_children_run_at_once_and_report_back(server: ScriptedServer, make_agent, home: Path) -> None:
    plain = script(rounds=2)
    together: list[bool] = []

    def reply(body: dict) -> Reply:
        if is_child(body) and not any(m["role"] == "tool" for m in body["messages"]):
            # A child's first call is answered only once all three have called (or 10 s have passed):
            # children run one after another would leave the others waiting behind this one.
            together.append(server.wait_for_requests(4, timeout=30))
        return plain(body)

    server.default = reply
    progress: list[str] = []
    agent = make_agent(tool_progress_callback=lambda phase, name, detail: progress.append(name))

    result = agent.run_conversation("cover three areas")

    assert together == [True, True, True]
    assert result["final_response"] == "all areas covered"
    report = next(m["content"] for m in result["messages"] if m["role"] == "tool")
    for i in range(3):
        assert f"report on area {i}" in report
    assert report.count("status: completed") == 3
    child_tokens = 3 * 3 * 10
    assert result["usage"]["input_tokens"] == 2 * 10 + child_tokens
    assert any(name.startswith("subagent 1 › list_directory") for name in progress)

    store = SessionStore.open(home)
    children = [row for row in store.list_sessions() if row["source"] == "subagent"]
    assert len(children) == 3
    assert {row["parent_id"] for row in children} == {result["session_id"]}
    child_request = next(s.body for s in server.requests if is_child(s.body))
    assert "delegate_task" not in json.dumps(child_request["tools"])
    assert "clarify" not in json.dumps(child_request["tools"])


def test_a_child_that_spends_its_budget_still_reports(server: ScriptedServer, make_agent, home: Path) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\ndelegation: {max_iterations: 2}\n")
    server.default = script(rounds=10, tasks=1)
    result = make_agent().run_conversation("go")
    report = next(m["content"] for m in result["messages"] if m["role"] == "tool")
    assert "status: budget_exhausted" in report
    assert result["final_response"] == "all areas covered"


def test_interrupting_the_parent_ends_every_child(server: ScriptedServer, make_agent, home: Path) -> None:
    server.default = script(rounds=2, delay=30)
    agent = make_agent()
    outcome: dict = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("result", agent.run_conversation("go")))
    worker.start()
    assert server.wait_for_requests(4)  # the parent's call and the three children's first calls

    agent.interrupt()
    worker.join(5)  # the children's replies are 30 s away: returning before means they were cut off

    assert not worker.is_alive()
    assert outcome["result"]["interrupted"] is True
    store = SessionStore.open(home)
    for row in store.list_sessions():
        assert repair_history(store.load_messages(row["id"]))[1] == [], row["source"]


def test_todo_list_is_kept_with_the_session(server: ScriptedServer, make_agent, home: Path) -> None:
    server.add(
        Reply(tool_calls=[("todo", {"action": "add", "items": ["write tests", "fix bug"]})]),
        Reply(tool_calls=[("todo", {"action": "update", "id": 2, "status": "done"})]),
        Reply(text="planned"),
    )
    result = make_agent().run_conversation("plan it")
    results = [m["content"] for m in result["messages"] if m["role"] == "tool"]
    assert results[0] == "1. [ ] write tests\n2. [ ] fix bug"
    assert results[1] == "1. [ ] write tests\n2. [x] fix bug"
    assert SessionStore.open(home).todos.get(result["session_id"])[1]["status"] == "done"
    server.add(
        Reply(tool_calls=[("todo", {"action": "update", "id": 9, "status": "done"})]), Reply(text="ok")
    )
    again = make_agent(session_id=result["session_id"]).run_conversation("again")
    assert (
        "update needs the id of a task (1 to 2)"
        in [m["content"] for m in again["messages"] if m["role"] == "tool"][-1]
    )
