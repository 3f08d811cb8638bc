"""`mibyan gateway` from outside: a real gateway (served in this process, and a process where the test is
about the process: its signals, a kill, its stderr), the openai SDK as its client, scripted models."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from conftest import run_cli, wait_until
from gatewaying import TOKEN, InProcessGateway, RunningGateway, ServedGateway, write_config
from loopback import Reply, ScriptedServer, held_until, user_texts

from agent_state import SessionStore
from mibyan.agent.messages import repair_history

MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "meepa-model"}


@pytest.fixture
def gateway(server: ScriptedServer, home: Path, start_gateway: Any) -> Iterator[InProcessGateway]:
    write_config(home, {"local": server.base_url}, [MEEPA], gateway={"max_concurrent": 32})
    with start_gateway(home) as running:
        yield running


@pytest.fixture
def process(server: ScriptedServer, home: Path) -> Iterator[RunningGateway]:
    """The same gateway as a `mibyan gateway` process, for the tests of its signals and its stderr."""
    write_config(home, {"local": server.base_url}, [MEEPA], gateway={"max_concurrent": 32})
    with RunningGateway(home) as running:
        yield running


def ask(gateway: ServedGateway, text: str, *, channel: str | None = None, key: str | None = None) -> Any:
    headers = {}
    if channel is not None:
        headers["X-Mibyan-Channel"] = channel
    if key is not None:
        headers["Idempotency-Key"] = key
    return gateway.client().chat.completions.with_raw_response.create(
        model="meepa", messages=[{"role": "user", "content": text}], extra_headers=headers
    )


def sessions(home: Path) -> list[dict[str, Any]]:
    store = SessionStore.open(home)
    try:
        return [row for row in store.list_sessions() if row["source"] == "gateway"]
    finally:
        store.close()


def recorded_messages(home: Path) -> int:
    """How many messages the gateway has accepted (each is in the ledger before it is acknowledged)."""
    store = SessionStore.open(home)
    try:
        return int(store.query("SELECT count(*) FROM gateway_inbox")[0][0])
    finally:
        store.close()


def test_each_agent_reaches_its_own_model_with_its_own_persona(home: Path, start_gateway: Any) -> None:
    with ScriptedServer() as first, ScriptedServer() as second:
        first.add(Reply(text="from meepa"))
        second.add(Reply(text="from bob"))
        agents = [MEEPA, {"id": "bob", "provider": "other", "model": "bob-model"}]
        write_config(home, {"local": first.base_url, "other": second.base_url}, agents)
        for agent_id, soul in (("meepa", "You are Meepa, who loves maps."), ("bob", "You are Bob, a baker.")):
            (home / "agents" / agent_id).mkdir(parents=True)
            (home / "agents" / agent_id / "SOUL.md").write_text(soul)
        (home / "agents" / "meepa" / "MEMORY.md").write_text(
            "Meepa's secret note: the map is in the attic.\n"
        )
        with start_gateway(home) as gateway:
            client = gateway.client()
            meepa = client.chat.completions.create(
                model="meepa", messages=[{"role": "user", "content": "hi"}]
            )
            bob = client.chat.completions.create(model="bob", messages=[{"role": "user", "content": "hi"}])

    assert (meepa.choices[0].message.content, bob.choices[0].message.content) == ("from meepa", "from bob")
    [to_meepa], [to_bob] = first.requests, second.requests
    assert to_meepa.body["model"] == "meepa-model" and to_bob.body["model"] == "bob-model"
    meepa_prompt, bob_prompt = (r.body["messages"][0]["content"] for r in (to_meepa, to_bob))
    assert "Meepa, who loves maps" in meepa_prompt and "the map is in the attic" in meepa_prompt
    assert "Bob, a baker" in bob_prompt
    assert "Meepa" not in bob_prompt and "attic" not in bob_prompt


def test_each_agents_model_server_is_asked_for_its_window_before_the_gateway_is_ready(
    home: Path, start_gateway: Any
) -> None:
    """What a message needs is loaded and asked at start, so the first message waits for no probe."""
    with ScriptedServer() as first, ScriptedServer() as second:
        first.models = [{"id": "meepa-model", "object": "model", "max_model_len": 8192}]
        second.models = [{"id": "bob-model", "object": "model", "max_model_len": 4096}]
        agents = [MEEPA, {"id": "bob", "provider": "other", "model": "bob-model"}]
        write_config(home, {"local": first.base_url, "other": second.base_url}, agents)
        with start_gateway(home) as gateway:
            asked_at_ready = (first.model_listings, second.model_listings)
            first.add(Reply(text="hello"))
            answer = ask(gateway, "hi", channel="c").parse()

    assert asked_at_ready == (1, 1)
    assert answer.choices[0].message.content == "hello"
    assert first.model_listings == 1  # the run used what the start learnt
    assert [request.path for request in first.requests] == ["/v1/chat/completions"]


def test_an_agents_messages_reuse_its_connection_to_the_model_server(
    gateway: InProcessGateway, server: ScriptedServer
) -> None:
    """Each message is a new run of the agent; the runs take turns on one kept connection rather than
    opening one each (for a provider, a TLS handshake before every answer)."""
    for channel in ("ann", "bo", "ann", "cy"):
        server.add(Reply(text=f"hello {channel}"))
        assert ask(gateway, "hi", channel=channel).parse().choices[0].message.content == f"hello {channel}"

    assert len({request.peer for request in server.requests}) == 1


def test_an_agents_skills_are_its_own(server: ScriptedServer, home: Path, start_gateway: Any) -> None:
    skill = home / "agents" / "meepa" / "skills" / "maps" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text(
        "---\nname: maps\ndescription: Reading sea charts\ntriggers: [chart]\n---\nUse the grid.\n"
    )
    write_config(home, {"local": server.base_url}, [MEEPA, {"id": "bob", "provider": "local"}])
    with start_gateway(home) as gateway:
        for agent_id in ("meepa", "bob"):
            gateway.client().chat.completions.create(
                model=agent_id, messages=[{"role": "user", "content": "read this chart"}]
            )

    to_meepa, to_bob = (json.dumps(r.body) for r in server.requests)
    assert "Use the grid." in to_meepa and "Reading sea charts" in to_meepa
    assert "grid" not in to_bob and "sea charts" not in to_bob


def test_a_fact_one_agent_remembers_is_never_offered_to_another(home: Path, start_gateway: Any) -> None:
    with ScriptedServer() as server:
        remember = {"action": "remember", "content": "The harbour vault code is 4471."}
        server.add(Reply(tool_calls=[("memory", remember)]), Reply(text="noted"))
        server.default = lambda body: Reply(text="answer")
        agents = [MEEPA, {"id": "bob", "provider": "local", "model": "bob-model"}]
        write_config(home, {"local": server.base_url}, agents)
        with start_gateway(home) as gateway:
            client = gateway.client()
            for agent_id in ("meepa", "bob", "meepa"):
                text = (
                    "remember the vault" if len(server.requests) == 0 else "what is the harbour vault code?"
                )
                message = {"role": "user", "content": text}
                client.chat.completions.create(model=agent_id, messages=[message], user="sam")

    to_bob, to_meepa = (json.dumps(r.body) for r in server.requests[2:])
    assert "4471" not in to_bob
    assert "4471" in to_meepa


def test_an_agent_sees_only_the_tools_its_entry_allows(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    agents = [
        {**MEEPA, "tools": {"allow": ["read_file", "list_directory"]}},
        {"id": "bob", "provider": "local", "tools": {"deny": ["terminal"]}},
    ]
    write_config(home, {"local": server.base_url}, agents)
    with start_gateway(home) as gateway:
        for agent_id in ("meepa", "bob"):
            gateway.client().chat.completions.create(
                model=agent_id, messages=[{"role": "user", "content": "hi"}]
            )

    meepa_tools, bob_tools = ({t["function"]["name"] for t in r.body["tools"]} for r in server.requests)
    assert meepa_tools == {"read_file", "list_directory"}
    assert "terminal" not in bob_tools and "read_file" in bob_tools
    assert {"session_search", "delegate_task"} <= bob_tools  # scoped to the agent's channel and limits


def test_an_agents_max_tool_failures_decides_when_the_model_is_told_to_change_course(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    for _ in range(2):
        server.add(Reply(tool_calls=[("read_file", {"path": "no-such-file.txt"})]), Reply(text="gave up"))
    write_config(
        home,
        {"local": server.base_url},
        [{**MEEPA, "max_tool_failures": 1}, {"id": "bob", "provider": "local"}],
    )
    with start_gateway(home) as gateway:
        for agent_id in ("meepa", "bob"):
            gateway.client().chat.completions.create(
                model=agent_id, messages=[{"role": "user", "content": "read it"}]
            )

    after_meepa, after_bob = (server.requests[i].body["messages"][-1]["content"] for i in (1, 3))
    assert "has failed 1 times in a row" in after_meepa
    assert "in a row" not in after_bob


def test_an_agents_prompt_has_its_generated_agents_md_not_the_start_folders(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    Path("AGENTS.md").write_text("Context of the folder the gateway was started in.")
    write_config(
        home, {"local": server.base_url}, [{**MEEPA, "name": "Meepa", "tools": {"allow": ["read_file"]}}]
    )
    with start_gateway(home) as gateway:
        gateway.client().chat.completions.create(model="meepa", messages=[{"role": "user", "content": "hi"}])

    prompt = server.requests[0].body["messages"][0]["content"]
    assert "# Project context (AGENTS.md)\n\n# Meepa" in prompt
    assert "- read_file:" in prompt and "- terminal:" not in prompt
    assert "started in" not in prompt
    assert ((home / "agents" / "meepa" / "AGENTS.md").stat().st_mode & 0o777) == 0o600


def test_interleaved_channels_keep_their_own_histories(
    gateway: InProcessGateway, server: ScriptedServer
) -> None:
    server.default = lambda body: Reply(text=f"reply to {user_texts(body)[-1]}")
    for channel, text in (("alice", "a1"), ("bob", "b1"), ("alice", "a2"), ("bob", "b2"), ("alice", "a3")):
        ask(gateway, text, channel=channel)

    alice_last, bob_last = server.requests[4].body, server.requests[3].body
    assert user_texts(alice_last) == ["a1", "a2", "a3"]
    assert user_texts(bob_last) == ["b1", "b2"]
    history = alice_last["messages"][1:]
    assert repair_history(history)[1] == []
    assert [m["content"] for m in history] == ["a1", "reply to a1", "a2", "reply to a2", "a3"]
    stored = sessions(gateway.home)
    assert sorted(row["channel"] for row in stored) == ["meepa/api/alice", "meepa/api/bob"]


def test_a_channel_is_a_stored_session_the_sessions_command_shows(
    gateway: InProcessGateway, server: ScriptedServer
) -> None:
    server.add(Reply(text="the tide turns at noon"))
    raw = ask(gateway, "when does the tide turn?", channel="carol")
    session_id = raw.headers["X-Mibyan-Session"]

    listed = run_cli("sessions", "list", "--json", home=gateway.home)
    shown = run_cli("sessions", "show", session_id, "--json", home=gateway.home)

    [row] = [r for r in json.loads(listed.stdout) if r["id"] == session_id]
    assert row["source"] == "gateway" and row["channel"] == "meepa/api/carol"
    assert [m["content"] for m in json.loads(shown.stdout)["messages"]] == [
        "when does the tide turn?",
        "the tide turns at noon",
    ]


def test_two_messages_at_once_on_one_channel_run_one_after_the_other(
    gateway: InProcessGateway, server: ScriptedServer
) -> None:
    both_in = threading.Event()

    def reply(body: dict[str, Any]) -> Reply:
        if len(server.requests) == 1:
            both_in.wait(30)  # hold the first answer until the gateway has the second message too
        return Reply(text=f"reply to {user_texts(body)[-1]}")

    server.default = reply
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, gateway, "first", channel="dave")
        assert server.wait_for_requests(1)
        second = pool.submit(ask, gateway, "second", channel="dave")
        assert wait_until(lambda: recorded_messages(gateway.home) == 2)
        assert len(server.requests) == 1  # the second waits for the first, though the gateway has it
        both_in.set()
        first.result(), second.result()

    assert len(server.requests) == 2
    assert user_texts(server.requests[1].body) == ["first", "second"]
    assert server.requests[1].body["messages"][2]["content"] == "reply to first"


def test_twenty_channels_run_at_the_same_time(gateway: InProcessGateway, server: ScriptedServer) -> None:
    all_in_flight: list[bool] = []

    def reply(body: dict[str, Any]) -> Reply:
        # No reply leaves before all twenty requests are at the model: only concurrent runs get there.
        all_in_flight.append(server.wait_for_requests(20, timeout=30))
        return Reply(text="ok", delay=0.2)

    server.default = reply
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda n: ask(gateway, "hello", channel=f"user{n}"), range(20)))

    assert [a.parse().choices[0].message.content for a in answers] == ["ok"] * 20
    assert all_in_flight == [True] * 20


def test_max_concurrent_caps_the_runs_in_flight(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    write_config(home, {"local": server.base_url}, [MEEPA], gateway={"max_concurrent": 2})
    release = threading.Event()

    server.default = held_until(release, "ok")
    with start_gateway(home) as gateway, ThreadPoolExecutor(5) as pool:
        answers = [pool.submit(ask, gateway, "hi", channel=f"c{n}") for n in range(5)]
        assert wait_until(lambda: recorded_messages(home) == 5)
        assert server.wait_for_requests(2)
        # a negative can only be observed for a while: a third run would reach the model within a second
        # (the first two took milliseconds from their messages being recorded)
        third_got_through = server.wait_for_requests(3, timeout=1)
        release.set()
        [answer.result() for answer in answers]

    assert not third_got_through
    assert len(server.requests) == 5


def test_a_repeated_idempotency_key_runs_once(gateway: InProcessGateway, server: ScriptedServer) -> None:
    server.add(Reply(text="only once"), Reply(text="a second run"))

    first = ask(gateway, "charge my card", channel="erin", key="order-17")
    again = ask(gateway, "charge my card", channel="erin", key="order-17")

    assert len(server.requests) == 1
    assert again.parse().choices[0].message.content == "only once"
    assert again.headers["X-Mibyan-Session"] == first.headers["X-Mibyan-Session"]
    store = SessionStore.open(gateway.home)
    assert [m["content"] for m in store.load_messages(first.headers["X-Mibyan-Session"])] == [
        "charge my card",
        "only once",
    ]


def test_a_run_killed_mid_turn_is_answered_after_restart_without_a_second_user_message(
    server: ScriptedServer, home: Path
) -> None:
    write_config(home, {"local": server.base_url}, [MEEPA])
    server.add(Reply(text="never sent", delay=60), Reply(text="the answer"))
    gateway = RunningGateway(home)
    with ThreadPoolExecutor(1) as pool:
        lost = pool.submit(ask, gateway, "what is 6 x 7?", channel="frank", key="m-1")
        assert server.wait_for_requests(1)
        gateway.kill()
        with pytest.raises(openai.APIConnectionError):
            lost.result()

    with RunningGateway(home) as restarted:
        retried = ask(restarted, "what is 6 x 7?", channel="frank", key="m-1")

    assert retried.parse().choices[0].message.content == "the answer"
    assert len(server.requests) == 2  # the cut-off run and its resumption; the retry ran nothing
    assert user_texts(server.requests[1].body) == ["what is 6 x 7?"]
    stored = SessionStore.open(home).load_messages(retried.headers["X-Mibyan-Session"])
    assert repair_history(stored)[1] == []
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[-1]["content"] == "the answer"


def test_sigterm_when_idle_exits_0(process: RunningGateway) -> None:
    assert process.terminate() == 0
    assert "Traceback" not in "".join(process.lines)


def test_sigterm_lets_a_running_turn_finish(process: RunningGateway, server: ScriptedServer) -> None:
    server.add(Reply(text="finished in time", delay=1))
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(ask, process, "slow question", channel="gina")
        assert server.wait_for_requests(1)
        process.process.send_signal(15)
        assert answer.result().parse().choices[0].message.content == "finished in time"
    assert process.process.wait(timeout=30) == 0


def test_streaming_passes_the_text_on_as_the_model_writes_it_and_yields_the_plain_reply(
    gateway: InProcessGateway, server: ScriptedServer
) -> None:
    client_has_text = threading.Event()
    text_came_while_the_model_wrote: list[bool] = []

    def hold(event: str) -> None:  # the model's stream stops after its first words, until the client has them
        if '"content": "The' in event:
            text_came_while_the_model_wrote.append(client_has_text.wait(30))

    answer = "The harbour opens at six, and closes at ten."
    for held in (None, hold):  # what the model says before a tool call is part of the reply, in both
        server.add(
            Reply(text="Let me look first.", tool_calls=[("todo", {"todos": []})]),
            Reply(text=answer, chunks=5, after_event=held),
        )
    plain = ask(gateway, "when does the harbour open?", channel="plain").parse().choices[0].message.content
    stream = gateway.client().chat.completions.create(
        model="meepa",
        messages=[{"role": "user", "content": "when does the harbour open?"}],
        stream=True,
        extra_headers={"X-Mibyan-Channel": "streamed"},
    )
    pieces: list[str] = []
    for event in stream:
        pieces.extend(choice.delta.content or "" for choice in event.choices)
        if answer[:3] in "".join(pieces):
            client_has_text.set()
        last = event

    assert "".join(pieces) == plain == f"Let me look first.\n\n{answer}"
    assert text_came_while_the_model_wrote == [True]
    assert len([p for p in pieces if p]) > 2
    assert last.choices[0].finish_reason == "stop"


def test_without_a_channel_the_messages_are_the_whole_conversation(
    gateway: InProcessGateway, server: ScriptedServer
) -> None:
    server.add(Reply(text="blue"), Reply(text="green"))
    client = gateway.client()
    history = [
        {"role": "user", "content": "my colour is blue"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "what is my colour?"},
    ]
    client.chat.completions.create(model="meepa", messages=history)
    client.chat.completions.create(model="meepa", messages=[{"role": "user", "content": "and now?"}])

    assert user_texts(server.requests[0].body) == ["my colour is blue", "what is my colour?"]
    assert user_texts(server.requests[1].body) == ["and now?"]


def _post(
    url: str, data: bytes | None, token: str | None = TOKEN, method: str = "POST"
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


_HI = [{"role": "user", "content": "hi"}]
#: (token, body, status, code): refusals that never reach a model, all asked of one running gateway
_REFUSED: list[tuple[str | None, dict[str, Any], int, str]] = [
    (None, {"model": "meepa", "messages": _HI}, 401, "invalid_api_key"),
    ("wrong", {"model": "meepa", "messages": _HI}, 401, "invalid_api_key"),
    (TOKEN, {"model": "nobody", "messages": _HI}, 404, "model_not_found"),
    (TOKEN, {"model": "meepa", "messages": []}, 400, "bad_request"),
    (TOKEN, {"model": "meepa", "messages": [{"role": "assistant", "content": "x"}]}, 400, "bad_request"),
    (
        TOKEN,
        {"model": "meepa", "user": "a\x1b[2J", "messages": [{"role": "user", "content": "x"}]},
        400,
        "bad_request",
    ),
]


def test_errors_come_in_openais_envelope_health_is_open_and_models_need_the_token(
    gateway: InProcessGateway,
) -> None:
    chat = f"{gateway.url}/chat/completions"
    for token, body, status, code in _REFUSED:
        got, payload = _post(chat, json.dumps(body).encode(), token)
        assert (got, payload["error"]["code"]) == (status, code), body
        assert set(payload["error"]) == {"message", "type", "code"}
    status, payload = _post(chat, b"{not json")
    assert (status, payload["error"]["type"]) == (400, "invalid_request_error")

    address = urllib.parse.urlsplit(gateway.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    connection.putrequest("POST", "/v1/chat/completions")
    connection.putheader("Authorization", f"Bearer {TOKEN}")
    connection.putheader("Content-Length", str(9 * 1024 * 1024))
    connection.endheaders()  # and not a byte of the body: too large is refused before it is read
    response = connection.getresponse()
    assert (response.status, json.loads(response.read())["error"]["code"]) == (400, "bad_request")

    root = gateway.url.removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/health", timeout=30) as health:
        assert health.status == 200
    assert [m.id for m in gateway.client().models.list()] == ["meepa"]
    with pytest.raises(openai.AuthenticationError):
        gateway.client(api_key="wrong").models.list()


def test_malformed_requests_are_400_in_the_envelope_and_leave_no_traceback(
    process: RunningGateway, server: ScriptedServer
) -> None:
    chat = f"{process.url}/chat/completions"
    hi = [{"role": "user", "content": "hi"}]
    bodies = [
        b"[" * 5000,
        b'{"model": "meepa", "messages": [{"role": "user", "content": "\\ud800"}]}',
        json.dumps({"model": "meepa", "messages": hi, "stream": "yes"}).encode(),
    ]
    answers = [_post(chat, body) for body in bodies]
    address = urllib.parse.urlsplit(process.url)
    hanging = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    hanging.putrequest("POST", "/v1/chat/completions")
    hanging.putheader("Authorization", f"Bearer {TOKEN}")
    hanging.putheader("Content-Length", "1000")
    hanging.endheaders(b'{"model": "meepa", "mess')
    hanging.close()  # the client hangs up halfway through its body
    with socket.create_connection((address.hostname, address.port), timeout=30) as raw:
        raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Mibyan-Channel: a\x01b\r\n\r\n")
        refused_by_uvicorn = raw.recv(1000)  # not HTTP: uvicorn's own plain-text 400
    log = process.home / "logs" / "gateway.log"
    assert wait_until(lambda: "hung up" in log.read_text())
    server.add(Reply(text="one"), Reply(text="two"))
    ask(process, "hi", channel="alice")
    padded = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    body = json.dumps({"model": "meepa", "messages": [{"role": "user", "content": "again"}]})
    padded.request(
        "POST",
        "/v1/chat/completions",
        body,
        {"Authorization": f"Bearer {TOKEN}", "X-Mibyan-Channel": " alice "},
    )
    assert padded.getresponse().status == 200
    assert process.terminate() == 0

    assert [(status, payload["error"]["code"]) for status, payload in answers] == [(400, "bad_request")] * 3
    assert [payload["error"]["message"] for _, payload in answers] == [
        "the body nests too deeply",
        "the body holds a lone surrogate (such as \\ud800), which is not text",
        "'stream' must be a boolean",
    ]
    assert user_texts(server.requests[1].body) == ["hi", "again"]  # the blanks around a channel do not count
    assert refused_by_uvicorn.startswith(b"HTTP/1.1 400") and b"text/plain" in refused_by_uvicorn
    assert all(line.startswith("mibyan gateway: ") for line in process.lines), process.lines
    assert "Traceback" not in log.read_text() and log.read_text().count("hung up") == 1


def test_unknown_routes_wrong_methods_and_our_own_failures_answer_in_openais_envelope(
    process: RunningGateway, server: ScriptedServer
) -> None:
    chat = f"{process.url}/chat/completions"
    body = json.dumps({"model": "meepa", "messages": [{"role": "user", "content": "hi"}]}).encode()
    folder = process.home / "agents" / "meepa"
    shutil.rmtree(folder)
    folder.write_text("a file where the agent's folder should be")  # the run cannot make its workspace

    answers = [
        _post(f"{process.url}/nowhere", body),
        _post(chat, None, method="GET"),
        _post(chat, body),
    ]

    assert [(status, payload["error"]["code"]) for status, payload in answers] == [
        (404, "not_found"),
        (405, "method_not_allowed"),
        (500, "internal_error"),
    ]
    assert all(set(payload["error"]) == {"message", "type", "code"} for _, payload in answers)
    assert process.terminate() == 0
    assert "Traceback" not in "".join(process.lines)
    assert "NotADirectoryError" in (process.home / "logs" / "gateway.log").read_text()


def test_a_reply_the_client_hung_up_on_is_not_marked_sent_and_its_retry_collects_it(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    write_config(home, {"local": server.base_url}, [MEEPA])
    hung_up = threading.Event()

    server.default = held_until(hung_up, "kept for you")
    gateway = start_gateway(home)
    address = urllib.parse.urlsplit(gateway.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    body = json.dumps({"model": "meepa", "messages": [{"role": "user", "content": "a long one"}]})
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Mibyan-Channel": "olga", "Idempotency-Key": "k-1"}
    connection.request("POST", "/v1/chat/completions", body, headers)
    assert server.wait_for_requests(1)
    connection.close()  # the client gives up while the model works
    hung_up.set()
    assert gateway.terminate() == 0  # once the run has ended and its reply is recorded
    assert outbox_states(home) == ["pending"]

    with start_gateway(home) as restarted:
        retried = ask(restarted, "a long one", channel="olga", key="k-1")
        assert restarted.terminate() == 0

    assert retried.parse().choices[0].message.content == "kept for you"
    assert len(server.requests) == 1
    assert outbox_states(home) == ["sent"]


def outbox_states(home: Path) -> list[str]:
    store = SessionStore.open(home)
    try:
        return [str(row[0]) for row in store.query("SELECT status FROM gateway_outbox ORDER BY id")]
    finally:
        store.close()


def test_a_failing_provider_is_502(gateway: InProcessGateway, server: ScriptedServer) -> None:
    server.add(Reply(status=500, error_body={"error": {"message": "the model is down"}}))
    with pytest.raises(openai.APIStatusError) as failure:
        ask(gateway, "hello", channel="hank")
    assert failure.value.status_code == 502
    assert failure.value.body["code"] == "provider_failed"  # type: ignore[index]


def test_the_log_masks_keys(gateway: InProcessGateway, server: ScriptedServer) -> None:
    key = "sk-" + "q7w8e9r0" * 4
    server.add(Reply(status=500, error_body={"error": {"message": f"bad key {key}"}}))
    with pytest.raises(openai.APIStatusError) as failure:
        ask(gateway, "hello", channel="kim")
    assert gateway.terminate() == 0

    assert "q7w8e9r0q7w8" not in failure.value.response.text

    log = gateway.home / "logs" / "gateway.log"
    assert (log.stat().st_mode & 0o777) == 0o600
    text = log.read_text()
    assert "failed" in text and "sk-q7w…[masked]" in text
    assert "q7w8e9r0q7w8" not in text


def test_a_host_other_machines_reach_needs_a_token(server: ScriptedServer, home: Path) -> None:
    connectors = [{"name": "api", "kind": "http", "host": "0.0.0.0", "port": 0}]
    write_config(home, {"local": server.base_url}, [MEEPA], connectors=connectors)

    done = run_cli("gateway", home=home, env={"MIBYAN_GATEWAY_TOKEN": ""})

    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "MIBYAN_GATEWAY_TOKEN" in done.stderr
    assert "0.0.0.0" in done.stderr


def test_a_streamed_reply_names_its_session(gateway: InProcessGateway, server: ScriptedServer) -> None:
    server.add(Reply(text="first"), Reply(text="second"))
    plain = ask(gateway, "one", channel="ivy")
    raw = gateway.client().chat.completions.with_raw_response.create(
        model="meepa",
        messages=[{"role": "user", "content": "two"}],
        stream=True,
        extra_headers={"X-Mibyan-Channel": "ivy"},
    )

    assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices) == "second"
    assert raw.headers["X-Mibyan-Session"] == plain.headers["X-Mibyan-Session"]


def test_a_stream_whose_provider_fails_is_502(gateway: InProcessGateway, server: ScriptedServer) -> None:
    server.add(Reply(status=500, error_body={"error": {"message": "the model is down"}}))
    with pytest.raises(openai.APIStatusError) as failure:
        gateway.client().chat.completions.create(
            model="meepa", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    assert failure.value.status_code == 502


def test_a_turn_still_running_after_the_grace_is_interrupted_and_answered_after_restart(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    write_config(home, {"local": server.base_url}, [MEEPA], gateway={"shutdown_grace": 0})
    server.add(Reply(text="too slow", delay=60), Reply(text="answered after the restart"))
    gateway = start_gateway(home)
    with ThreadPoolExecutor(1) as pool:
        cut = pool.submit(ask, gateway, "a long question", channel="jack", key="m-9")
        assert server.wait_for_requests(1)
        assert gateway.terminate() == 0
        with pytest.raises(openai.APIStatusError) as refused:
            cut.result()
    assert refused.value.status_code == 503

    with start_gateway(home) as restarted:
        retried = ask(restarted, "a long question", channel="jack", key="m-9")

    assert retried.parse().choices[0].message.content == "answered after the restart"
    stored = SessionStore.open(home).load_messages(retried.headers["X-Mibyan-Session"])
    assert [(m["role"], m["content"]) for m in stored] == [
        ("user", "a long question"),
        ("assistant", "answered after the restart"),
    ]


def test_a_turn_cut_by_a_stop_without_an_idempotency_key_is_run_once_by_its_repeat_not_also_by_the_restart(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    """The client is told to repeat the request; without a key its repeat is a new message, so the
    restarted gateway does not run the cut one as well (a second model call, an answer to nobody)."""
    write_config(home, {"local": server.base_url}, [MEEPA], gateway={"shutdown_grace": 0})
    server.add(Reply(text="too slow", delay=60), Reply(text="the repeat's answer"), Reply(text="run twice"))
    gateway = start_gateway(home)
    with ThreadPoolExecutor(1) as pool:
        cut = pool.submit(ask, gateway, "a long question", channel="kim")
        assert server.wait_for_requests(1)
        assert gateway.terminate() == 0
        with pytest.raises(openai.APIStatusError) as refused:
            cut.result()
    assert refused.value.status_code == 503
    assert "repeat the request" in refused.value.message

    with start_gateway(home) as restarted:  # a resumed message would run first: the channel is a FIFO
        repeated = ask(restarted, "a long question", channel="kim")

    assert repeated.parse().choices[0].message.content == "the repeat's answer"
    assert len(server.requests) == 2
    assert "without an Idempotency-Key" in (home / "logs" / "gateway.log").read_text()


def test_a_long_session_is_compressed_after_its_answer_is_delivered(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    write_config(home, {"local": server.base_url}, [{**MEEPA, "tools": {"allow": ["todo"]}}])
    config = yaml.safe_load((home / "config.yaml").read_text())
    # requests never need compressing before they are sent (threshold 0.9), but every session past 1 % of
    # the window is compressed between turns, down to what a summary aims for (0.54 of it)
    config["model"]["context_window"] = 3000
    config["compression"] = {"threshold": 0.9, "gateway_threshold": 0.01, "protect_last_n": 2}
    (home / "config.yaml").write_text(yaml.safe_dump(config))
    delivered = threading.Event()
    summarized_after_delivery: list[bool] = []

    def reply(body: dict[str, Any]) -> Reply:
        if "You compress the middle of a conversation" in json.dumps(body["messages"][:1]):
            summarized_after_delivery.append(delivered.wait(30))
            return Reply(text="## Goal\nChat about tides.\n## Current state\nThe user asked three times.\n")
        return Reply(text="the tide " + "y" * 1500)

    server.default = reply
    with start_gateway(home) as gateway:
        for text in ("first", "second", "third"):
            delivered.clear()
            answer = ask(gateway, f"{text} {'x' * 1500}", channel="nina").parse().choices[0].message.content
            assert answer.startswith("the tide")
            delivered.set()
        ask(gateway, "fourth", channel="nina")

    assert summarized_after_delivery and all(summarized_after_delivery)
    last = json.dumps(server.requests[-1].body["messages"])
    assert "Chat about tides." in last and "fourth" in last


def test_conversations_without_a_channel_run_at_once_not_in_one_queue(
    gateway: InProcessGateway, server: ScriptedServer
) -> None:
    both_in_flight: list[bool] = []

    def reply(body: dict[str, Any]) -> Reply:
        both_in_flight.append(server.wait_for_requests(2, timeout=30))
        return Reply(text="ok")

    server.default = reply
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda n: ask(gateway, f"question {n}"), range(2)))

    assert both_in_flight == [True, True]


def test_an_idempotency_key_without_a_channel_never_returns_another_conversations_reply(
    gateway: InProcessGateway, server: ScriptedServer
) -> None:
    server.add(Reply(text="alice's private answer"), Reply(text="bob's answer"))
    ask(gateway, "alice's private question", key="1")

    bob = ask(gateway, "bob's question", key="1")

    assert bob.parse().choices[0].message.content == "bob's answer"
    assert len(server.requests) == 2


def test_the_same_conversation_without_a_channel_repeated_with_its_key_runs_once(
    gateway: InProcessGateway, server: ScriptedServer
) -> None:
    server.add(Reply(text="first and only"))
    first = ask(gateway, "the question", key="k-7")
    again = ask(gateway, "the question", key="k-7")

    assert again.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert len(server.requests) == 1


def test_a_failed_provider_is_skipped_by_the_agents_next_runs_and_an_overflow_compacts_the_channel(
    home: Path, start_gateway: Any
) -> None:
    overflowed: list[str] = []

    def backup_reply(body: dict[str, Any]) -> Reply:
        if "You compress the middle of a conversation" in json.dumps(body["messages"][:1]):
            return Reply(text="## Goal\nCount to four.\n")
        last = user_texts(body)[-1]
        if last == "three" and not overflowed:
            overflowed.append(last)
            return Reply(status=400, error_body={"error": {"message": "maximum context length exceeded"}})
        return Reply(text=f"backup answers {last}")

    with ScriptedServer() as primary, ScriptedServer(backup_reply) as backup:
        primary.default = lambda body: Reply(status=503, error_body={"error": {"message": "down"}})
        write_config(home, {"local": primary.base_url, "backup": backup.base_url}, [MEEPA])
        config = yaml.safe_load((home / "config.yaml").read_text())
        config["fallback_providers"] = [{"provider": "backup", "model": "backup-model"}]
        config["agent"]["health_check_interval"] = 3600
        config["compression"] = {"protect_last_n": 2}
        (home / "config.yaml").write_text(yaml.safe_dump(config))
        with start_gateway(home) as gateway:
            answers = [
                ask(gateway, text, channel=channel).parse().choices[0].message.content
                for text, channel in (
                    ("one", "ann"),
                    ("two", "ben"),
                    ("again", "ann"),
                    ("three", "ann"),
                    ("four", "ann"),
                )
            ]

    assert answers == [f"backup answers {n}" for n in ("one", "two", "again", "three", "four")]
    assert len(primary.requests) == 1  # the first run's failure; no later run, on any channel, asked it
    assert {seen.body["model"] for seen in backup.requests} == {"backup-model"}
    assert overflowed == [
        "three"
    ]  # it overflowed once: the channel's session was compacted (a summary call), then the call retried
    to_backup = [json.dumps(seen.body["messages"]) for seen in backup.requests]
    retried, four = to_backup[-2], to_backup[-1]
    assert "Count to four." in retried and "backup answers one" not in retried
    assert "Count to four." in four and "backup answers three" in four and "backup answers one" not in four
