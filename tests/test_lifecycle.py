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


def test_sdk_clients_keep_only_the_newest_few_whatever_their_keys(server: ScriptedServer, make_agent) -> None:
    """A key that changes every message (an api_key_command handing out short-lived keys) leaves at most
    `keep` connections open: the oldest key's client is closed, the newest's is lent again."""
    server.default = lambda body: Reply(text="ok")
    with SdkClients(keep=2) as clients:
        for number in (0, 1, 2, 3, 0, 3):
            with make_agent(sdk_clients=clients, api_key=f"key-{number}") as agent:
                agent.chat("hello")
    peers = [request.peer for request in server.requests]
    assert len(set(peers[:4])) == 4
    assert peers[4] not in peers[:4]  # key-0's client was the oldest of four: closed, not kept
    assert peers[5] == peers[3]  # key-3's was among the newest two: lent again, its connection open


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


@pytest.mark.parametrize("api_mode", ["chat_completions", "anthropic_messages", "codex_responses"])
def test_a_stream_whose_body_never_ends_after_its_last_event_gives_the_answer_and_is_cut(
    server: ScriptedServer, make_agent, home: Path, api_mode: str
) -> None:
    """A server that sends a stream's last event (`[DONE]`, `message_stop`, `response.completed`) and
    then keeps the body open is waited for a moment, then cut off; the answer stands, and it is not
    asked again (a wait for the body's end would have lasted the server's minute: no hang-up)."""
    (home / "config.yaml").write_text("agent:\n  stream_stall_timeout: 120\n  api_max_retries: 0\n")
    server.add(Reply(text="whole answer", held_open=True), Reply(text="next"))
    base_url = server.root_url if api_mode == "anthropic_messages" else server.base_url
    with make_agent(api_mode=api_mode, base_url=base_url) as agent:
        assert agent.chat("hello") == "whole answer"
        assert server.wait_for_hangups(1)  # cut off, not left holding the server's connection
        assert agent.chat("again") == "next"
    first, second = server.requests
    assert first.peer != second.peer  # the cut connection is not used again


def test_a_whole_answer_whose_body_is_held_open_is_kept_even_with_a_stall_timeout_below_the_wait(
    server: ScriptedServer, make_agent, home: Path
) -> None:
    """Once the last event came the answer cannot stall: a stall timeout shorter than the moment it is
    given to end does not fail it."""
    (home / "config.yaml").write_text("agent:\n  stream_stall_timeout: 0.3\n  api_max_retries: 0\n")
    server.add(Reply(text="whole answer", held_open=True))
    with make_agent() as agent:
        assert agent.chat("hello") == "whole answer"


def test_a_request_whose_kept_connection_the_server_closed_is_sent_again_on_a_new_one(
    server: ScriptedServer, make_agent
) -> None:
    """A server closes an idle connection when its keep-alive runs out; a call that set off on it in
    that instant is sent again at once on a new connection, not failed (no retries are configured)."""
    server.add(Reply(text="one"), Reply(unanswered=True), Reply(text="two"))
    with make_agent() as agent:
        assert agent.chat("hello") == "one"
        assert agent.chat("again") == "two"
    first, closed, again = (request.peer for request in server.requests)
    assert closed == first  # it went on the kept connection
    assert again != closed


def test_a_kept_connection_closed_while_the_server_worked_on_the_request_is_not_sent_again(
    server: ScriptedServer, make_agent
) -> None:
    """A server that read the call and worked on it before it fell over may have made it: it is not
    made again behind the user's back (no retries are configured)."""
    server.add(Reply(text="one"), Reply(unanswered=True, delay=1.0), Reply(text="made twice"))
    with make_agent() as agent:
        assert agent.chat("hello") == "one"
        assert agent.run_conversation("again")["exit_reason"] == "error"
    assert len(server.requests) == 2
    assert server.requests[1].peer == server.requests[0].peer  # it went on the kept connection


def test_a_new_connection_closed_without_an_answer_is_not_sent_again(
    server: ScriptedServer, make_agent
) -> None:
    """On a connection of its own the hang-up is the server's answer: the call fails, once."""
    server.add(Reply(unanswered=True), Reply(text="asked twice"))
    with make_agent() as agent:
        assert agent.run_conversation("hello")["exit_reason"] == "error"
    assert len(server.requests) == 1


def test_a_connection_cut_by_an_interrupt_is_not_lent_to_the_next_agent(
    server: ScriptedServer, make_agent
) -> None:
    server.add(Reply(text="too late", delay=30), Reply(text="answered"))
    with SdkClients() as clients:
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
