"""An agent closes what it opens, and holds one conversation at a time."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
from conftest import run_in_background
from loopback import Reply, ScriptedServer

from mibyan.agent.providers import SdkClients
from mibyan.core.errors import AgentBusyError


def open_handles_to(path: Path) -> int:
    """How many file descriptors of this process point at `path`."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:  # closed between listdir and readlink
            continue
    return count


def test_the_context_manager_closes_the_session_database(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    server.add(Reply(text="hi"))
    with make_agent() as agent:
        assert agent.chat("hello") == "hi"
        assert open_handles_to(home / "state.db") == 1

    assert open_handles_to(home / "state.db") == 0


def test_subagents_are_closed_when_their_task_is_done(server: ScriptedServer, make_agent, home: Path) -> None:
    server.add(
        Reply(tool_calls=[("delegate_task", {"tasks": [{"goal": "one"}, {"goal": "two"}]})]),
        Reply(text="report one"),
        Reply(text="report two"),
        Reply(text="both done"),
    )
    # The garbage collector would close a leaked connection some time later; the agent must not rely on it.
    gc.disable()
    try:
        with make_agent() as agent:
            assert agent.chat("split the work") == "both done"
        # SQLite keeps a closed connection's descriptor until the process's last one on the file closes.
        assert open_handles_to(home / "state.db") == 0
    finally:
        gc.enable()


def test_a_second_conversation_on_a_running_agent_is_refused(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(text="first", delay=30), Reply(text="second"))
    agent = make_agent()
    worker, outcome = run_in_background(agent, "one")
    assert server.wait_for_requests(1)

    with pytest.raises(AgentBusyError, match="already running"):
        agent.run_conversation("two at once")

    agent.interrupt()
    worker.join(10)
    assert outcome["interrupted"] is True
    assert agent.chat("now the second") == "second"
    assert [m["content"] for m in agent.store.load_messages(agent.session_id) if m["role"] == "user"] == [
        "one",
        "now the second",
    ]
    agent.close()


def test_a_closed_agent_says_so(server: ScriptedServer, make_agent) -> None:
    agent = make_agent()
    agent.close()
    agent.close()  # twice is fine
    with pytest.raises(AgentBusyError, match="closed"):
        agent.chat("hello")


def test_closing_a_running_agent_interrupts_the_run_and_waits_for_it(
    server: ScriptedServer, make_agent
) -> None:
    server.add(Reply(text="too late", delay=30))
    agent = make_agent()
    worker, outcome = run_in_background(agent, "take your time")
    assert server.wait_for_requests(1)

    agent.close()

    assert not worker.is_alive()  # close() returned after the run did, not 30 s later
    assert outcome["interrupted"] is True
    worker.join()


def test_agents_sharing_sdk_clients_take_turns_on_one_connection(server: ScriptedServer, make_agent) -> None:
    server.add(Reply(text="one"), Reply(text="two"), Reply(text="three"), Reply(text="alone"))
    clients = SdkClients()
    for text in ("one", "two"):
        with make_agent(sdk_clients=clients) as agent:
            assert agent.chat("hello") == text
    clients.close()
    with make_agent(sdk_clients=clients) as agent:  # after close(): a client of its own, closed with it
        assert agent.chat("hello") == "three"
    with make_agent() as agent:
        assert agent.chat("hello") == "alone"

    first, second, third, alone = (request.peer for request in server.requests)
    assert first == second  # the second agent took the first one's client and its open connection
    assert len({first, third, alone}) == 3


def test_a_body_that_breaks_off_after_its_last_event_still_gives_the_whole_answer(
    server: ScriptedServer, make_agent
) -> None:
    """An agent reads a stream's body to its end after `[DONE]` (to keep its connection); a server that
    hangs up before the end has sent the whole answer all the same, and it is not asked again."""
    server.add(Reply(text="all of it", unended=True), Reply(text="asked twice"))
    with make_agent() as agent:
        assert agent.chat("hello") == "all of it"
        assert agent.chat("again") == "asked twice"  # on a new connection
    first, second = server.requests
    assert first.peer != second.peer


def test_a_connection_cut_by_an_interrupt_is_not_lent_to_the_next_agent(
    server: ScriptedServer, make_agent
) -> None:
    server.add(Reply(text="too late", delay=30), Reply(text="answered"))
    clients = SdkClients()
    agent = make_agent(sdk_clients=clients)
    worker, outcome = run_in_background(agent, "take your time")
    assert server.wait_for_requests(1)
    agent.interrupt()
    worker.join(10)
    agent.close()
    assert outcome["interrupted"] is True
    assert server.wait_for_hangups(1)  # the provider saw the hang-up: it stops generating for nobody

    with make_agent(sdk_clients=clients) as after:
        assert after.chat("hello") == "answered"
    cut, answered = (request.peer for request in server.requests)
    assert cut != answered
    clients.close()


@pytest.mark.parametrize("command", ["/new", "/model gpt-4o"])
def test_the_chat_closes_the_agent_it_replaces(
    server: ScriptedServer, home: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    from mibyan.cli.commands import dispatch
    from mibyan.cli.main import build_parser
    from mibyan.cli.repl import Repl

    monkeypatch.setenv("MIBYAN_HOME", str(home))
    repl = Repl(build_parser().parse_args(["chat", "--base-url", server.base_url]), None)
    replaced = repl.agent

    dispatch(repl, command)

    assert repl.agent is not replaced
    with pytest.raises(AgentBusyError, match="closed"):
        replaced.chat("are you still there?")
    repl.close()
