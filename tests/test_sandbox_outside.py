"""One command outside the sandbox: only with the user's yes, every time; never under --yolo alone, never
for a subagent, never for a command that never runs."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from loopback import Reply, ScriptedServer
from sandboxing import (
    Places,
    configure,
    needs_bwrap,
)
from test_repl_tmux import Terminal
from test_tools import tool_results


def outside(server: ScriptedServer, *commands: str) -> None:
    """Script the model to ask for each command to run outside the sandbox, then to finish."""
    for command in commands:
        server.add(Reply(tool_calls=[("terminal", {"command": command, "outside_sandbox": True})]))
    server.add(Reply(text="done"))


@needs_bwrap
def test_running_outside_the_sandbox_asks_the_user_every_time(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places
) -> None:
    outside(server, f"touch {places.elsewhere}/a", f"touch {places.elsewhere}/b")
    asked: list[tuple[str, str]] = []

    make_agent(approval_callback=lambda c, r: asked.append((c, r)) or "session").run_conversation("go")

    assert [reason for _, reason in asked] == ["runs outside the sandbox", "runs outside the sandbox"]
    assert (places.elsewhere / "a").exists() and (places.elsewhere / "b").exists()


@needs_bwrap
def test_a_denied_request_to_leave_the_sandbox_does_not_run(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places
) -> None:
    outside(server, f"touch {places.elsewhere}/a")
    result = make_agent(approval_callback=lambda c, r: "deny").run_conversation("go")

    assert not (places.elsewhere / "a").exists()
    assert tool_results(result)[0].startswith("denied by user")


@needs_bwrap
def test_yolo_without_a_user_never_leaves_the_sandbox(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places
) -> None:
    outside(server, f"rm -rf {places.elsewhere}")
    result = make_agent(yolo=True).run_conversation("go")

    assert places.elsewhere.exists()
    assert "the user must say yes each time, even with --yolo" in tool_results(result)[0]


@needs_bwrap
def test_a_hardline_command_stays_blocked_outside_the_sandbox(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places
) -> None:
    outside(server, "rm -rf ~")
    asked: list[str] = []
    result = make_agent(approval_callback=lambda c, r: asked.append(c) or "once").run_conversation("go")

    assert asked == [] and tool_results(result)[0].startswith("blocked:")


@needs_bwrap
def test_earlier_answers_for_other_kinds_do_not_cover_leaving_the_sandbox(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places, home: Path
) -> None:
    configure(home, "{mode: workspace-write}")
    (home / "config.yaml").write_text(
        (home / "config.yaml").read_text() + "approvals: {always: [rm_recursive, outside_sandbox]}\n"
    )
    outside(server, f"rm -rf {places.elsewhere}")
    asked: list[str] = []
    make_agent(approval_callback=lambda c, r: asked.append(r) or "deny").run_conversation("go")

    assert asked == ["runs outside the sandbox, and deletes a folder and everything in it (rm -r)"]
    assert places.elsewhere.exists()


@needs_bwrap
def test_a_subagent_never_leaves_the_sandbox_on_the_users_behalf(
    server: ScriptedServer, make_agent: Callable[..., Any], places: Places
) -> None:
    escape = f"rm -rf {places.elsewhere}"

    def reply(body: dict[str, Any]) -> Reply:
        tools = [m for m in body["messages"] if m["role"] == "tool"]
        child = next(m["content"] for m in body["messages"] if m["role"] == "user").startswith("Task: ")
        if child:
            if not tools:
                return Reply(tool_calls=[("terminal", {"command": escape, "outside_sandbox": True})])
            return Reply(text=f"child saw: {tools[0]['content']}")
        if len(tools) == 0:
            return Reply(tool_calls=[("terminal", {"command": escape})])  # approved for the session
        if len(tools) == 1:
            return Reply(tool_calls=[("delegate_task", {"tasks": [{"goal": "clean up"}]})])
        return Reply(text="done")

    server.default = reply
    asked: list[str] = []
    result = make_agent(approval_callback=lambda c, r: asked.append(r) or "session").run_conversation("go")

    # the parent's own call; the child's request never reached the user
    assert asked == ["deletes a folder and everything in it (rm -r)"]
    assert (places.elsewhere / "keep.txt").exists()
    assert "denied by user" in tool_results(result)[1]


@needs_bwrap
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_in_the_chat_the_user_lets_one_command_out_and_is_asked_again_for_the_next(
    server: ScriptedServer, places: Places, home: Path
) -> None:
    server.add(
        Reply(tool_calls=[("terminal", {"command": f"touch {places.elsewhere}/a", "outside_sandbox": True})]),
        Reply(text="First done."),
        Reply(tool_calls=[("terminal", {"command": f"touch {places.elsewhere}/b", "outside_sandbox": True})]),
        Reply(text="Second refused."),
    )
    environment = {"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    chat = Terminal(
        [sys.executable, "-m", "mibyan.cli.main", "chat", "--base-url", server.base_url], environment
    )
    try:
        chat.wait_for("›")
        chat.send("make a", "Enter")
        chat.wait_for("This command runs outside the sandbox")
        chat.send("s", "Enter")  # "for the session" still covers only this one command
        chat.wait_for("First done.")
        chat.send("make b", "Enter")
        chat.wait_for("This command runs outside the sandbox", count=2)
        chat.send("d", "Enter")
        chat.wait_for("Second refused.")
    finally:
        chat.close()

    assert (places.elsewhere / "a").exists() and not (places.elsewhere / "b").exists()
