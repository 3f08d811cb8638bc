"""A stream dropped mid-answer and retried never shows the user the same text twice."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from loopback import Reply, ScriptedServer

ANSWER = "The answer is forty-two, and here is why it is so."


@pytest.fixture
def retrying_home(home: Path) -> Path:
    (home / "config.yaml").write_text("agent: {api_max_retries: 2, max_retry_wait: 0.05}\n")
    return home


def watch(make_agent, home: Path) -> tuple[object, list[str], list[tuple[str, str]]]:
    deltas: list[str] = []
    statuses: list[tuple[str, str]] = []
    agent = make_agent(
        home=home,
        stream_delta_callback=deltas.append,
        status_callback=lambda kind, message: statuses.append((kind, message)),
    )
    return agent, deltas, statuses


def test_a_retry_that_repeats_the_shown_text_only_adds_what_is_new(
    server: ScriptedServer, make_agent, retrying_home: Path
) -> None:
    server.add(Reply(text=ANSWER[:20], cut=True), Reply(text=ANSWER, chunks=7))
    agent, deltas, statuses = watch(make_agent, retrying_home)

    result = agent.run_conversation("why?")

    assert result["final_response"] == ANSWER
    assert "".join(deltas) == ANSWER
    assert len(server.requests) == 2
    assert not any(kind == "stream_restart" for kind, _ in statuses)


def test_a_retry_that_says_something_else_restarts_the_display_visibly(
    server: ScriptedServer, make_agent, retrying_home: Path
) -> None:
    server.add(Reply(text="A first try that goes", cut=True), Reply(text=ANSWER))
    agent, deltas, statuses = watch(make_agent, retrying_home)

    result = agent.run_conversation("why?")

    assert result["final_response"] == ANSWER
    restarts = [i for i, (kind, _) in enumerate(statuses) if kind == "stream_restart"]
    assert len(restarts) == 1
    shown = "".join(deltas)
    assert shown.startswith("A first try that goes") and shown.endswith(ANSWER)
    assert shown.count(ANSWER) == 1


def test_a_retry_that_stops_short_of_what_was_shown_restarts_the_display(
    server: ScriptedServer, make_agent, retrying_home: Path
) -> None:
    short = "The answer is forty-two."
    server.add(Reply(text=short + " Let me also explain", cut=True), Reply(text=short))
    agent, deltas, statuses = watch(make_agent, retrying_home)

    result = agent.run_conversation("why?")

    assert result["final_response"] == short
    assert [kind for kind, _ in statuses].count("stream_restart") == 1
    assert "".join(deltas).endswith(" Let me also explain" + short)


def test_a_one_shot_answer_on_stdout_is_the_final_answer_exactly_once(
    server: ScriptedServer, retrying_home: Path
) -> None:
    server.add(Reply(text="A first try that goes", cut=True), Reply(text=ANSWER))
    done = run_cli("chat", "-q", "why?", "--base-url", server.base_url, home=retrying_home)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ANSWER + "\n"


def test_a_one_shot_retry_of_the_same_text_prints_it_once(
    server: ScriptedServer, retrying_home: Path
) -> None:
    server.add(Reply(text=ANSWER[:20], cut=True), Reply(text=ANSWER))
    done = run_cli("chat", "-q", "why?", "--base-url", server.base_url, home=retrying_home)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ANSWER + "\n"


def run_on_a_terminal(*args: str, home: Path) -> str:
    """Run `mibyan` with its stdout on a pseudo-terminal; return what the terminal received."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "MIBYAN_HOME": str(home), "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "mibyan.cli.main", *args], stdout=terminal, stderr=subprocess.DEVNULL, env=env
    )
    os.close(terminal)
    received = b""
    while True:
        try:
            data = os.read(controller, 4096)
        except OSError:  # the terminal closed: the process has ended
            break
        if not data:
            break
        received += data
    os.close(controller)
    assert process.wait(timeout=60) == 0
    return received.decode().replace("\r\n", "\n")


def test_on_a_terminal_the_retried_answer_goes_on_where_it_was_cut(
    server: ScriptedServer, retrying_home: Path
) -> None:
    server.add(Reply(text=ANSWER[:20], cut=True), Reply(text=ANSWER))
    shown = run_on_a_terminal("chat", "-q", "why?", "--base-url", server.base_url, home=retrying_home)
    assert shown == ANSWER + "\n"


def test_on_a_terminal_a_different_retry_is_shown_after_a_visible_break(
    server: ScriptedServer, retrying_home: Path
) -> None:
    server.add(Reply(text="A first try that goes", cut=True), Reply(text=ANSWER))
    shown = run_on_a_terminal("chat", "-q", "why?", "--base-url", server.base_url, home=retrying_home)
    assert shown == f"A first try that goes\n[the connection dropped; the answer again:]\n{ANSWER}\n"


pieces = st.lists(st.text(alphabet="ab ", min_size=1, max_size=4), max_size=8)


@settings(max_examples=400, deadline=None)
@given(attempts=st.lists(pieces, min_size=1, max_size=4))
def test_whatever_the_retries_say_the_screen_ends_on_the_last_reply(attempts: list[list[str]]) -> None:
    """Deltas after the last restart, appended to what was shown before it, read as the final reply."""
    from mibyan.agent.callbacks import Callbacks, ShownText, StreamRelay
    from mibyan.core.interruptible import InterruptSignal

    screen: list[str] = []
    callbacks = Callbacks(
        stream_delta_callback=screen.append,
        status_callback=lambda kind, _: screen.clear() if kind == "stream_restart" else None,
    )
    shown = ShownText()
    for attempt in attempts:
        relay = StreamRelay(callbacks, InterruptSignal(), shown)
        for delta in attempt:
            relay.on_text(delta)
    relay.finish()
    assert "".join(screen) == "".join(attempts[-1])


@settings(max_examples=200, deadline=None)
@given(first=st.text(alphabet="ab ", max_size=12), more=st.text(alphabet="ab ", max_size=12))
def test_a_retry_that_extends_what_was_shown_never_restarts(first: str, more: str) -> None:
    from mibyan.agent.callbacks import Callbacks, ShownText, StreamRelay
    from mibyan.core.interruptible import InterruptSignal

    screen: list[str] = []
    restarts: list[str] = []
    callbacks = Callbacks(
        stream_delta_callback=screen.append, status_callback=lambda kind, _: restarts.append(kind)
    )
    shown = ShownText()
    if first:
        StreamRelay(callbacks, InterruptSignal(), shown).on_text(first)  # the attempt that was cut
    relay = StreamRelay(callbacks, InterruptSignal(), shown)
    whole = first + more
    for start in range(0, len(whole), 3):
        relay.on_text(whole[start : start + 3])
    relay.finish()
    assert restarts == []
    assert "".join(screen) == whole
