"""Only the tools an agent was given run: tools.allow/deny and a subagent's selection bind what runs."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli
from loopback import Reply, ScriptedServer


def tool_results(server: ScriptedServer) -> list[str]:
    return [m["content"] for m in server.requests[-1].body["messages"] if m["role"] == "tool"]


def test_a_denied_tool_the_model_calls_anyway_does_not_run(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\ntools: {deny: [terminal, memory]}\n")
    server.add(
        Reply(
            tool_calls=[
                ("terminal", {"command": "echo ran > ran.txt"}),
                ("memory", {"action": "add", "content": "planted"}),
            ]
        ),
        Reply(text="done"),
    )

    done = run_cli("chat", "-q", "go", "--base-url", server.base_url, home=home, cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    offered = {tool["function"]["name"] for tool in server.requests[0].body["tools"]}
    assert "terminal" not in offered and "memory" not in offered
    assert not (tmp_path / "ran.txt").exists()
    assert not (home / "memories" / "MEMORY.md").exists()
    assert all("not one of your tools" in result for result in tool_results(server))


def test_an_allow_list_binds_what_runs(
    make_agent, server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 0}\ntools: {allow: [read_file]}\n")
    (tmp_path / "notes.txt").write_text("kept")
    server.add(
        Reply(
            tool_calls=[
                ("write_file", {"path": "notes.txt", "content": "lost"}),
                ("read_file", {"path": "notes.txt"}),
            ]
        ),
        Reply(text="done"),
    )

    make_agent().run_conversation("go")

    refused, read = tool_results(server)
    assert "not one of your tools" in refused
    assert "kept" in read
    assert (tmp_path / "notes.txt").read_text() == "kept"


def test_a_subagent_cannot_use_the_tools_it_was_not_given(
    make_agent, server: ScriptedServer, home: Path
) -> None:
    def reply(body: dict) -> Reply:
        first = next(m["content"] for m in body["messages"] if m["role"] == "user")
        answered = any(m["role"] == "tool" for m in body["messages"])
        if first.startswith("Task: "):  # a subagent; only the first one tries to reach further
            if answered or not first.startswith("Task: clean"):
                return Reply(text="child report")
            return Reply(
                tool_calls=[
                    ("delegate_task", {"tasks": [{"goal": "nested"}]}),
                    ("memory", {"action": "add", "content": "always run rm -rf"}),
                ]
            )
        return (
            Reply(text="parent done")
            if answered
            else Reply(tool_calls=[("delegate_task", {"goal": "clean"})])
        )

    server.default = reply

    result = make_agent().run_conversation("delegate")

    assert result["final_response"] == "parent done"

    def first_user(body: dict) -> str:
        return next(m["content"] for m in body["messages"] if m["role"] == "user")

    nested = [r for r in server.requests if first_user(r.body).startswith("Task: nested")]
    assert nested == []  # no second-level subagent started
    child_results = [
        m["content"]
        for r in server.requests
        if first_user(r.body).startswith("Task: clean")
        for m in r.body["messages"]
        if m["role"] == "tool"
    ]
    assert len(child_results) == 2
    assert all("not one of your tools" in text for text in child_results), child_results
    assert not (home / "memories" / "MEMORY.md").exists()
