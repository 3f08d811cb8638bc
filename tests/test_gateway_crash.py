"""A gateway killed mid-turn (`kill -9`) and started again: the cut turn goes on from what it stored."""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import run_cli, wait_until
from gatewaying import RunningGateway, write_config
from loopback import Reply, ScriptedServer, held_until

from agent_state import SessionStore
from mibyan.agent.messages import INTERRUPTED_RESULT

MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "meepa-model"}
CHARGE = ("terminal", {"command": "echo charged >> side.txt"})


def ask(gateway: RunningGateway, messages: list[dict[str, Any]], **headers: str) -> Any:
    return gateway.client().chat.completions.with_raw_response.create(
        model="meepa", messages=messages, extra_headers=headers
    )


def stored(home: Path, session_id: str) -> list[dict[str, Any]]:
    store = SessionStore.open(home)
    try:
        return store.load_messages(session_id)
    finally:
        store.close()


def inbox_states(home: Path) -> list[str]:
    store = SessionStore.open(home)
    try:
        return [str(row[0]) for row in store.query("SELECT status FROM gateway_inbox ORDER BY id")]
    finally:
        store.close()


def release(fifo: Path) -> None:
    """Let a `cat` the killed gateway left blocked on `fifo` end (if it outlived its gateway)."""
    with contextlib.suppress(OSError):  # nobody reads it any more
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_crash_during_a_tool_call_never_runs_the_finished_one_again(
    server: ScriptedServer, home: Path
) -> None:
    workspace = home / "agents" / "meepa" / "workspace"
    workspace.mkdir(parents=True)
    os.mkfifo(workspace / "gate")
    write_config(home, {"local": server.base_url}, [MEEPA])
    server.add(
        Reply(tool_calls=[CHARGE]),
        Reply(tool_calls=[("terminal", {"command": "touch started; cat gate"})]),
        Reply(text="charged once"),
    )
    said = [{"role": "user", "content": "charge my card"}]
    gateway = RunningGateway(home)
    with ThreadPoolExecutor(1) as pool:
        lost = pool.submit(ask, gateway, said, **{"X-Mibyan-Channel": "pat", "Idempotency-Key": "c-1"})
        assert wait_until((workspace / "started").exists)
        gateway.kill()
        with pytest.raises(openai.APIConnectionError):
            lost.result()
    release(workspace / "gate")

    with RunningGateway(home) as restarted:
        retried = ask(restarted, said, **{"X-Mibyan-Channel": "pat", "Idempotency-Key": "c-1"})

    assert retried.parse().choices[0].message.content == "charged once"
    assert (workspace / "side.txt").read_text() == "charged\n"
    assert len(server.requests) == 3  # the cut turn's two calls, then one to go on: nothing ran twice
    messages = stored(home, retried.headers["X-Mibyan-Session"])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert messages[0]["content"] == "charge my card"
    assert messages[2]["content"] != INTERRUPTED_RESULT  # the finished call's own result
    assert messages[4]["content"] == INTERRUPTED_RESULT  # the cut call, answered, not run again
    assert [m["role"] for m in server.requests[2].body["messages"]][1:] == [m["role"] for m in messages[:5]]
    assert inbox_states(home) == ["answered"]


def test_a_keyed_one_off_goes_on_in_its_session_and_one_nobody_can_collect_is_not_run_again(
    server: ScriptedServer, home: Path
) -> None:
    workspace = home / "agents" / "meepa" / "workspace"
    write_config(home, {"local": server.base_url}, [MEEPA])
    server.add(
        Reply(text="never sent", delay=60),  # the keyless one-off's
        Reply(tool_calls=[CHARGE]),
        Reply(text="never sent", delay=60),  # cut during the keyed one's second model call
        Reply(text="charged once"),
    )
    said = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "charge my card"}]
    gateway = RunningGateway(home)
    with ThreadPoolExecutor(2) as pool:
        keyless = pool.submit(ask, gateway, [{"role": "user", "content": "hello"}])
        assert server.wait_for_requests(1)
        keyed = pool.submit(ask, gateway, said, **{"Idempotency-Key": "c-2"})
        assert server.wait_for_requests(3)
        gateway.kill()
        for lost in (keyless, keyed):
            with pytest.raises(openai.APIConnectionError):
                lost.result()

    with RunningGateway(home) as restarted:
        retried = ask(restarted, said, **{"Idempotency-Key": "c-2"})
        assert restarted.terminate() == 0

    assert retried.parse().choices[0].message.content == "charged once"
    assert (workspace / "side.txt").read_text() == "charged\n"
    assert len(server.requests) == 4  # the keyless one was not asked again
    messages = stored(home, retried.headers["X-Mibyan-Session"])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert inbox_states(home) == ["failed", "answered"]
    assert "not run again" in (home / "logs" / "gateway.log").read_text()


def test_a_chat_cannot_resume_a_session_a_gateway_is_running(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    write_config(home, {"local": server.base_url}, [MEEPA])
    go_on = threading.Event()

    server.default = held_until(go_on, "answered")
    said = [{"role": "user", "content": "my diagnosis is private"}]
    with start_gateway(home) as gateway, ThreadPoolExecutor(1) as pool:
        running = pool.submit(ask, gateway, said, **{"X-Mibyan-Channel": "quinn"})
        assert server.wait_for_requests(1)
        store = SessionStore.open(home)
        [session] = [row["id"] for row in store.list_sessions() if row["source"] == "gateway"]
        store.close()
        chat = ("chat", "--resume", session, "-q", "what did they say?", "--base-url", server.base_url)
        refused = run_cli(*chat, home=home)
        go_on.set()
        assert running.result().parse().choices[0].message.content == "answered"
        resumed = run_cli(*chat, "-Q", home=home)  # the run is over: the session is free again

    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "being run by another process" in refused.stderr
    assert f"(pid {os.getpid()})" in refused.stderr  # the gateway (on a thread here) holds it
    assert len(server.requests) == 2 and resumed.returncode == 0, resumed.stderr
    assert [m["role"] for m in stored(home, session)] == ["user", "assistant", "user", "assistant"]
