"""The interactive chat driven in a real terminal: tmux send-keys and capture-pane."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ROOT, wait_until
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
        # -J joins wrapped lines, so a long line reads the same at any width
        return self._tmux("capture-pane", "-t", "chat", "-p", "-J", "-S", "-200")

    def wait_for(self, text: str, timeout: float = 15.0, *, count: int = 1) -> str:
        return self.wait_until(lambda screen: screen.count(text) >= count, repr(text), timeout)

    def wait_until(self, shows: Callable[[str], bool], what: str, timeout: float = 15.0) -> str:
        """The first screen that `shows` accepts (fails with the last screen if none does in time)."""
        shown = wait_until(lambda: [screen] if shows(screen := self.screen()) else None, timeout)
        if shown is None:
            raise AssertionError(f"{what} did not appear; the screen:\n{self.screen()}")
        return str(shown[0])

    def close(self) -> None:
        self._tmux("kill-server")


StartChat = Callable[..., Terminal]


@pytest.fixture
def start_chat(server: ScriptedServer, home: Path) -> Iterator[StartChat]:
    """Start `mibyan chat` against the scripted server, with extra environment variables if given."""
    started: list[Terminal] = []

    def start(**env: str) -> Terminal:
        environment = {"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", **env}
        command = [sys.executable, "-m", "mibyan.cli.main", "chat", "--base-url", server.base_url]
        started.append(Terminal(command, environment))
        return started[-1]

    yield start
    for terminal in started:
        terminal.close()


@pytest.fixture
def chat(start_chat: StartChat) -> Terminal:
    return start_chat()


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


def test_a_retried_stream_that_says_something_else_starts_below_a_note(
    server: ScriptedServer, home: Path, start_chat: StartChat
) -> None:
    (home / "config.yaml").write_text("agent: {api_max_retries: 1, max_retry_wait: 0.01}\n")
    server.add(Reply(text="Alpha beta gamma delta", cut=True), Reply(text="Omega answer here."))
    chat = start_chat()
    chat.wait_for("›")
    chat.send("go", "Enter")
    screen = chat.wait_for("Omega answer here.")
    lines = screen.splitlines()
    answer = next(i for i, line in enumerate(lines) if "Omega answer here." in line)
    assert "Alpha" not in lines[answer]  # not joined onto the text the retry replaced
    assert any("Alpha" in line for line in lines[:answer])


def test_ctrl_c_stops_a_slow_reply_and_the_chat_goes_on(
    server: ScriptedServer, start_chat: StartChat
) -> None:
    server.add(Reply(text="too late", delay=10), Reply(text="Back with you."))
    chat = start_chat(MIBYAN_CTRL_C_WINDOW="0")  # no second press counts: every ^C is a first one
    chat.wait_for("›")
    chat.send("take your time", "Enter")
    assert server.wait_for_requests(1)
    chat.send("C-c")
    chat.wait_for("(interrupted)")
    chat.wait_for("›", count=2)
    chat.send("C-c")  # a later ^C at the prompt only says how to leave
    chat.wait_for("^C again to exit")
    chat.send("still there?", "Enter")
    chat.wait_for("Back with you.")
    sent = [m["content"] for m in server.requests[-1].body["messages"] if m["role"] == "user"]
    assert sent == ["take your time", "still there?"]


def test_two_quick_ctrl_c_leave_the_chat_with_130(server: ScriptedServer, start_chat: StartChat) -> None:
    server.add(Reply(text="too late", delay=10))
    chat = start_chat(MIBYAN_CTRL_C_WINDOW="600")
    chat.wait_for("›")
    chat.send("take your time", "Enter")
    assert server.wait_for_requests(1)
    chat.send("C-c")
    chat.wait_for("^C again to exit")
    chat.send("C-c")
    assert "EXIT=130" in chat.wait_for("EXIT=")


def test_ctrl_c_at_an_approval_question_refuses_at_once_and_the_turn_goes_on(
    server: ScriptedServer, chat: Terminal, tmp_path: Path
) -> None:
    victim = tmp_path / "precious"
    victim.mkdir()
    server.add(
        Reply(tool_calls=[("terminal", {"command": f"rm -r {victim}"})]),
        Reply(text="Understood, I left it alone."),
        Reply(text="Back with you."),
    )
    chat.wait_for("›")
    chat.send("clean up", "Enter")
    chat.wait_for("Run it? [o]nce")
    chat.send("C-c")
    screen = chat.wait_for("Understood, I left it alone.")
    assert victim.exists() and "(interrupted)" not in screen
    [refusal] = [m["content"] for m in server.requests[1].body["messages"] if m["role"] == "tool"]
    assert "denied" in refusal
    chat.wait_for("›", count=2)
    chat.send("still there?", "Enter")
    screen = chat.wait_for("Back with you.")
    after = screen[screen.index("› still there?") :]
    assert "terminal" not in after  # nothing of the question comes late
    messages = server.requests[-1].body["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["clean up", "still there?"]


def test_an_interrupted_tool_is_shown_as_interrupted_without_a_spinner(
    server: ScriptedServer, chat: Terminal
) -> None:
    server.add(Reply(tool_calls=[("terminal", {"command": "sleep 30"})]), Reply(text="unused"))
    chat.wait_for("›")
    chat.send("wait a while", "Enter")
    chat.wait_for("terminal(command='sleep 30')")
    chat.send("C-c")
    chat.wait_for("(interrupted)")
    screen = chat.wait_for("›", count=2)
    lines = [line for line in screen.splitlines() if "terminal(command='sleep 30')" in line]
    assert len(lines) == 1 and "interrupted" in lines[0] and "✓" not in lines[0]
    assert not re.search("[\u2800-\u28ff]", screen), "a spinner frame was left on the screen"


def test_yolo_lasts_after_a_new_session(server: ScriptedServer, chat: Terminal, tmp_path: Path) -> None:
    victim = tmp_path / "scratch"
    victim.mkdir()
    server.add(Reply(tool_calls=[("terminal", {"command": f"rm -r {victim}"})]), Reply(text="Cleaned."))
    chat.wait_for("›")
    chat.send("/yolo", "Enter")
    chat.wait_for("yolo on")
    chat.send("/new", "Enter")
    chat.wait_for("new session")
    chat.send("clean up", "Enter")
    screen = chat.wait_for("Cleaned.")
    assert not victim.exists() and "Run it?" not in screen


def test_an_answer_for_the_session_lasts_after_a_model_change(
    server: ScriptedServer, chat: Terminal, tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    server.add(
        Reply(tool_calls=[("terminal", {"command": f"rm -r {first}"})]),
        Reply(text="First gone."),
        Reply(tool_calls=[("terminal", {"command": f"rm -r {second}"})]),
        Reply(text="Second gone."),
    )
    chat.wait_for("›")
    chat.send("clean the first", "Enter")
    chat.wait_for("Run it? [o]nce")
    chat.send("s", "Enter")
    chat.wait_for("First gone.")
    chat.send("/model gpt-4o", "Enter")
    chat.wait_for("gpt-4o via")
    chat.send("clean the second", "Enter")
    screen = chat.wait_for("Second gone.")
    assert not first.exists() and not second.exists()
    assert screen.count("Run it?") == 1
    assert server.requests[-1].body["model"] == "gpt-4o"


def test_resume_of_an_unknown_id_says_so_and_the_chat_goes_on(server: ScriptedServer, chat: Terminal) -> None:
    server.add(Reply(text="Still here."))
    chat.wait_for("›")
    chat.send("/resume zzzz", "Enter")
    chat.wait_for("no session 'zzzz'")
    chat.send("hello", "Enter")
    screen = chat.wait_for("Still here.")
    assert "EXIT=" not in screen


def test_a_banner_at_start_and_a_spinner_until_the_first_token(
    server: ScriptedServer, start_chat: StartChat, home: Path
) -> None:
    server.add(Reply(text="too late", delay=30), Reply(text="Quick answer."))
    chat = start_chat(MIBYAN_CTRL_C_WINDOW="0")
    banner = next(
        line for line in chat.wait_for("/help for commands").splitlines() if "/help for commands" in line
    )
    assert "gpt-4o-mini via openai" in banner
    chat.send("take your time", "Enter")
    chat.wait_for("thinking…")
    assert re.search(r"thinking… \d+\.\ds", chat.screen())
    chat.send("C-c")
    chat.wait_for("(interrupted)")
    chat.send("quick now", "Enter")
    screen = chat.wait_for("Quick answer.")
    assert "thinking…" not in screen  # the spinner goes when the answer comes, leaving no trace
    from agent_state import SessionStore

    store = SessionStore.open(home)
    try:
        assert f"session {store.sessions.most_recent()}" in banner
    finally:
        store.close()


def test_reasoning_and_the_answer_are_on_separate_lines(server: ScriptedServer, chat: Terminal) -> None:
    server.add(Reply(reasoning="Two and two make four.", text="The answer is 4."))
    chat.wait_for("›")
    chat.send("what is 2+2?", "Enter")
    screen = chat.wait_for("The answer is 4.")
    line = next(line for line in screen.splitlines() if "The answer is 4." in line)
    assert "Two and two" not in line and "Two and two make four." in screen


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


def test_a_broken_config_ends_the_chat_at_once_with_one_line(start_chat: StartChat, home: Path) -> None:
    (home / "config.yaml").write_text("agent:\n  colour: blue\n")
    screen = start_chat().wait_for("EXIT=")
    # -J joins what tmux wrapped, but a line printed while the prompt redraws can still break at the edge
    assert "agent.colour:unknownkey" in "".join(screen.split())
    assert "EXIT=2" in screen and "Traceback" not in screen


def test_retry_asks_again_and_undo_forgets_the_turn(server: ScriptedServer, chat: Terminal) -> None:
    server.add(Reply(text="First try."), Reply(text="Second try."))
    chat.wait_for("›")
    chat.send("what now?", "Enter")
    chat.wait_for("First try.")
    chat.send("/retry", "Enter")
    chat.wait_for("Second try.")
    assert [m["content"] for m in server.requests[-1].body["messages"][1:]] == ["what now?"]
    chat.send("/undo", "Enter")
    chat.wait_for("forgot: what now?")
    chat.send("/tools", "Enter")
    # each tool is its own line, printed one after another: wait for the later one, not a half-drawn list
    screen = chat.wait_for(f"  {'terminal':<16} ")
    assert f"  {'read_file':<16} " in screen


def test_an_approval_shows_the_escapes_hidden_in_a_command(
    server: ScriptedServer, chat: Terminal, tmp_path: Path
) -> None:
    (tmp_path / "x").mkdir()
    disguised = "rm -rf ./x # \x1b[1A\x1b[2K\r ... ls -la"
    server.add(Reply(tool_calls=[("terminal", {"command": disguised})]), Reply(text="Left it alone."))
    chat.wait_for("›")
    chat.send("tidy up", "Enter")
    screen = chat.wait_for("Run it? [o]nce")
    assert "rm -rf ./x # \\x1b[1A\\x1b[2K\\x0d ... ls -la" in screen
    chat.send("d", "Enter")
    chat.wait_for("Left it alone.")
    assert (tmp_path / "x").is_dir()


def test_escape_sequences_in_an_answer_are_shown_not_obeyed(server: ScriptedServer, chat: Terminal) -> None:
    server.add(
        Reply(tool_calls=[("\x1b[2Jno_such_tool", {})]),
        Reply(text="before \x1b[2J\x1b[H\x1b]0;pwned\x07 after [bold red]plain[/bold red]"),
    )
    chat.wait_for("›")
    chat.send("hello", "Enter")
    screen = chat.wait_for("20 in · 10 out")
    assert "✗ \\x1b[2Jno_such_tool()" in screen
    assert "before \\x1b[2J\\x1b[H\\x1b]0;pwned\\x07 after [bold red]plain[/bold red]" in screen
    assert "hello" in screen  # the screen was not cleared


def test_a_file_outside_the_project_is_asked_for_by_name(
    server: ScriptedServer, home: Path, tmp_path: Path
) -> None:
    user = tmp_path / "user"
    (user / ".ssh").mkdir(parents=True)
    (user / ".ssh" / "id_rsa").write_text("secret-material")
    server.add(Reply(tool_calls=[("read_file", {"path": "~/.ssh/id_rsa"})]), Reply(text="Did not read it."))
    env = {"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", "HOME": str(user)}
    terminal = Terminal([sys.executable, "-m", "mibyan.cli.main", "chat", "--base-url", server.base_url], env)
    try:
        terminal.wait_for("›")
        terminal.send("show my key", "Enter")
        screen = terminal.wait_for("Run it? [o]nce")
        assert f"read_file {user}/.ssh/id_rsa" in screen.replace("\n", "")
        assert "This command reads ~/.ssh, which holds SSH keys." in screen
        terminal.send("d", "Enter")
        terminal.wait_for("Did not read it.")
    finally:
        terminal.close()
    assert "secret-material" not in json.dumps(server.requests[-1].body)


def test_a_one_shot_answer_on_a_terminal_shows_its_escapes(server: ScriptedServer, home: Path) -> None:
    server.add(Reply(text="visible \x1b[2J\x1b]0;pwned\x07 end"))
    env = {"MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT), "TERM": "xterm-256color"}
    command = [sys.executable, "-m", "mibyan.cli.main", "chat", "-q", "hi", "--base-url", server.base_url]
    terminal = Terminal(command, env)
    try:
        screen = terminal.wait_for("EXIT=0")
    finally:
        terminal.close()
    assert "visible \\x1b[2J\\x1b]0;pwned\\x07 end" in screen


def test_a_notice_written_while_the_chat_loads_goes_above_the_prompt(
    start_chat: StartChat, tmp_path: Path
) -> None:
    (tmp_path / ".mibyan").mkdir()
    (tmp_path / ".mibyan" / "config.yaml").write_text('hooks: {pre_tool_call: ["echo hi"]}\n')
    chat = start_chat()
    chat.wait_for("›")
    chat.send("hel")  # typed while it loads
    # the banner is printed above the prompt, which is drawn again below it a moment later (the prompt
    # erased for it may stay in tmux's scrollback, as a terminal's clear does)
    screen = chat.wait_until(
        lambda s: "/help for commands" in s and s.rfind("› hel") > s.find("mibyan ·") >= 0,
        "the prompt below the banner",
    )
    [notice] = [line for line in screen.splitlines() if "mibyan: ignored in" in line]
    assert notice.startswith("mibyan: ignored in ")  # on a line of its own, not over the prompt
    assert screen.index(notice) < screen.index("mibyan ·") < screen.rindex("› hel")
