"""The interactive chat driven in a real terminal: tmux send-keys and capture-pane."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT
from loopback import Reply, ScriptedServer

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Terminal:
    """One tmux session on a private socket."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.socket = f"mibyan-test-{uuid.uuid4().hex[:8]}"
        line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + shlex.join(command)
        self._tmux(
            "new-session", "-d", "-s", "chat", "-x", "110", "-y", "45", f"env {line}; echo EXIT=$?; sleep 30"
        )

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=False
        ).stdout

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "chat", *keys)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-t", "chat", "-p", "-S", "-200")

    def wait_for(self, text: str, timeout: float = 15.0, *, count: int = 1) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if screen.count(text) >= count:
                return screen
            time.sleep(0.05)
        raise AssertionError(f"{text!r} did not appear; the screen:\n{self.screen()}")

    def close(self) -> None:
        self._tmux("kill-server")


@pytest.fixture
def chat(server: ScriptedServer, home: Path) -> Iterator[Terminal]:
    env = {"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    terminal = Terminal([sys.executable, "-m", "mibyan.cli.main", "chat", "--base-url", server.base_url], env)
    yield terminal
    terminal.close()


def test_a_two_turn_chat_with_a_tool_call(server: ScriptedServer, chat: Terminal) -> None:
    server.add(
        Reply(tool_calls=[("list_directory", {"path": "."})]),
        Reply(text="The folder has **two** files."),
        Reply(text="Second answer here."),
    )
    chat.wait_for("›")
    chat.send("what is here?", "Enter")
    screen = chat.wait_for("20 in · 10 out")  # the footer comes last
    assert "The folder has two files." in screen
    assert "✓ list_directory(path='.')" in screen
    chat.send("and now?", "Enter")
    chat.wait_for("Second answer here.")
    assert [m["role"] for m in server.requests[-1].body["messages"]][-2:] == ["assistant", "user"]


def test_ctrl_c_stops_a_slow_reply_and_the_chat_goes_on(server: ScriptedServer, chat: Terminal) -> None:
    server.add(Reply(text="too late", delay=10), Reply(text="Back with you."))
    chat.wait_for("›")
    chat.send("take your time", "Enter")
    assert server.wait_for_requests(1)
    chat.send("C-c")
    chat.wait_for("(interrupted)")
    chat.wait_for("›", count=2)
    time.sleep(2.1)  # a second ^C within 2 s would leave the chat: this one must not
    chat.send("still there?", "Enter")
    chat.wait_for("Back with you.")
    sent = [m["content"] for m in server.requests[-1].body["messages"] if m["role"] == "user"]
    assert sent == ["take your time", "still there?"]


def test_resume_shows_the_last_exchange_and_continues(
    server: ScriptedServer, chat: Terminal, home: Path
) -> None:
    server.add(Reply(text="Paris is the capital."), Reply(text="About 2.1 million people."))
    from run_agent import AIAgent

    earlier = AIAgent(base_url=server.base_url, home=home)
    earlier.chat("capital of France?")
    chat.wait_for("›")
    chat.send(f"/resume {earlier.session_id[:6]}", "Enter")
    chat.wait_for("Paris is the capital.")
    chat.send("how many live there?", "Enter")
    chat.wait_for("About 2.1 million people.")
    contents = [m["content"] for m in server.requests[-1].body["messages"][1:]]
    assert contents == ["capital of France?", "Paris is the capital.", "how many live there?"]


def test_a_denied_command_does_not_run(server: ScriptedServer, chat: Terminal, tmp_path: Path) -> None:
    victim = tmp_path / "precious"
    victim.mkdir()
    server.add(
        Reply(tool_calls=[("terminal", {"command": f"rm -r {victim}"})]), Reply(text="Understood, kept it.")
    )
    chat.wait_for("›")
    chat.send("clean up", "Enter")
    chat.wait_for("Run it? [o]nce")
    chat.send("d", "Enter")
    chat.wait_for("Understood, kept it.")
    assert victim.exists()
    tool = next(m for m in server.requests[-1].body["messages"] if m["role"] == "tool")
    assert tool["content"].startswith("denied by user")


def test_a_broken_config_ends_the_chat_at_once_with_one_line(server: ScriptedServer, home: Path) -> None:
    (home / "config.yaml").write_text("agent:\n  colour: blue\n")
    env = {"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    terminal = Terminal([sys.executable, "-m", "mibyan.cli.main", "chat", "--base-url", server.base_url], env)
    try:
        screen = terminal.wait_for("EXIT=")
    finally:
        terminal.close()
    assert "agent.colour: unknown key" in screen.replace("\n", "")  # the terminal wraps the long line
    assert "EXIT=2" in screen and "Traceback" not in screen
