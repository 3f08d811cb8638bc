"""`mibyan chat` without a terminal, and the agent's read-only surface the chat uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import run_cli
from loopback import Reply, ScriptedServer

from agent_state import SessionStore


def test_text_piped_into_chat_is_answered_as_a_one_shot_prompt(server: ScriptedServer, home: Path) -> None:
    server.add(Reply(text="Piped answer."))
    done = run_cli("chat", "--base-url", server.base_url, home=home, stdin="summarise this\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Piped answer.\n"
    assert "stdin is not a terminal" in done.stderr and "-q -" in done.stderr
    assert server.requests[0].body["messages"][-1]["content"] == "summarise this"


def test_without_a_terminal_a_dangerous_command_is_refused_because_nobody_could_be_asked(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "precious"
    victim.mkdir()
    server.add(Reply(tool_calls=[("terminal", {"command": f"rm -r {victim}"})]), Reply(text="Kept it."))
    done = run_cli("chat", "-q", "clean up", "--base-url", server.base_url, home=home)
    assert done.returncode == 0, done.stderr
    assert victim.exists()
    tool = next(m for m in server.requests[-1].body["messages"] if m["role"] == "tool")
    assert tool["content"].startswith("refused: nobody could be asked to approve it")
    assert "--yolo" in tool["content"] and "denied by user" not in tool["content"]


def test_the_history_is_a_copy_that_cannot_change_the_session(
    make_agent: Any, server: ScriptedServer
) -> None:
    server.add(Reply(text="Hello."))
    agent = make_agent()
    agent.chat("hi")
    history = agent.history
    assert [m["role"] for m in history] == ["user", "assistant"]
    history[0]["content"] = "tampered"
    assert agent.history[0]["content"] == "hi"


def test_the_tool_schemas_name_the_tools_the_model_sees(make_agent: Any) -> None:
    names = [schema.name for schema in make_agent(enabled_toolsets=["core"]).tool_schemas]
    assert "terminal" in names and "read_file" in names


def test_undo_last_turn_forgets_it_in_the_store_too(
    make_agent: Any, server: ScriptedServer, home: Path
) -> None:
    server.add(Reply(text="First."), Reply(text="Second."))
    agent = make_agent()
    agent.chat("one")
    agent.chat("two")
    assert agent.undo_last_turn() == "two"
    assert [m["content"] for m in agent.history] == ["one", "First."]
    store = SessionStore.open(home)
    try:
        assert [m["content"] for m in store.load_messages(agent.session_id)] == ["one", "First."]
    finally:
        store.close()
    assert make_agent().undo_last_turn() is None


def test_a_command_killed_by_a_signal_is_shown_failed_and_one_that_exits_non_zero_ok(
    server: ScriptedServer, home: Path
) -> None:
    server.add(
        Reply(tool_calls=[("terminal", {"command": "echo before; kill -KILL $$"})]),
        Reply(tool_calls=[("terminal", {"command": "exit 3"})]),
        Reply(text="Done."),
    )
    done = run_cli("chat", "-q", "go", "--base-url", server.base_url, home=home)
    assert done.returncode == 0, done.stderr
    killed, exited = (line for line in done.stderr.splitlines() if "⚙ terminal" in line)
    assert "kill -KILL" in killed and "· failed ·" in killed
    assert "exit 3" in exited and "· ok ·" in exited
    results = [m["content"] for m in server.requests[-1].body["messages"] if m["role"] == "tool"]
    assert results[0].startswith("before\n[exit code 137 ·") and results[1].startswith("[exit code 3 ·")
