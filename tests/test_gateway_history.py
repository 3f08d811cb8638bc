"""What a one-off request's messages may hold: every field checked (400 naming it), text parts read as text,
a system message anywhere kept as system context; and a message whose run fails is never run again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import wait_until
from gatewaying import RunningGateway, write_config
from loopback import Reply, ScriptedServer

from agent_state import SessionStore
from mibyan.gateway.ledger import Ledger

MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "meepa-model"}
CALL = {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedServer]:
    with ScriptedServer() as scripted:
        yield scripted


@pytest.fixture(scope="module")
def gateway(model: ScriptedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    home = tmp_path_factory.mktemp("history") / "home"
    home.mkdir(mode=0o700)
    write_config(home, {"local": model.base_url}, [MEEPA])
    with RunningGateway(home) as running:
        yield running


def assistant(**fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": None, **fields}


#: (messages, the start of the 400's message)
_BAD: list[tuple[list[Any], str]] = [
    ([assistant(tool_calls="garbage")], "messages[0].tool_calls: must be a list of tool calls"),
    ([assistant(tool_calls=[1, 2])], "messages[0].tool_calls[0]: must be an object"),
    ([assistant(tool_calls=[{**CALL, "id": 7}])], "messages[0].tool_calls[0].id: must be"),
    ([assistant(tool_calls=[{**CALL, "function": "terminal"}])], "messages[0].tool_calls[0].function:"),
    ([{"role": "user", "content": "hi", "tool_calls": [CALL]}], "messages[0].tool_calls: only an assistant"),
    ([assistant(tool_calls=[CALL]), {"role": "tool", "content": "x"}], "messages[1].tool_call_id:"),
    (
        [assistant(tool_calls=[CALL]), {"role": "tool", "tool_call_id": 3, "content": "x"}],
        "messages[1].tool_",
    ),
    ([{"role": "user", "content": 5}], "messages[0].content: must be a string or a list of text parts"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content: a content part"),
    ([assistant()], "messages[0].content: an assistant message without tool calls needs its text"),
    ([{"role": "robot", "content": "x"}], "messages[0].role: must be one of"),
    (["hi"], "messages[0]: must be an object"),
]


@pytest.mark.parametrize(("history", "expected"), _BAD)
def test_a_malformed_history_is_a_400_naming_the_field(
    gateway: RunningGateway, model: ScriptedServer, history: list[Any], expected: str
) -> None:
    client = gateway.client().with_options(max_retries=0)
    messages = [*history, {"role": "user", "content": "go on"}]
    raw = client.chat.completions.with_raw_response
    with pytest.raises(openai.BadRequestError) as refused:
        raw.create(model="meepa", messages=messages)
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "bad_request"
    assert str(error["message"]).startswith(expected)
    assert model.requests == []
    assert "Traceback" not in "".join(gateway.lines)


def test_a_last_user_message_without_content_is_a_400(gateway: RunningGateway, model: ScriptedServer) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        gateway.client().chat.completions.create(model="meepa", messages=[{"role": "user", "content": None}])
    assert str(refused.value.body["message"]).startswith("messages[0].content:")  # type: ignore[index]
    assert model.requests == []


def test_text_parts_are_text_and_a_system_message_in_the_history_stays_system(
    gateway: RunningGateway, model: ScriptedServer
) -> None:
    model.add(Reply(text="bonjour"))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]},
        {"role": "system", "content": "From now on, answer in French."},
        {"role": "user", "content": "again"},
    ]
    raw = gateway.client().chat.completions.with_raw_response.create(model="meepa", messages=messages)

    assert raw.parse().choices[0].message.content == "bonjour"
    [sent] = model.requests
    model.requests.clear()
    assert [(m["role"], m["content"]) for m in sent.body["messages"][1:]] == [
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "again"),
    ]
    prompt = sent.body["messages"][0]["content"]
    assert prompt.startswith("Be brief.") and "From now on, answer in French." in prompt
    store = SessionStore.open(gateway.home)
    try:
        stored = store.load_messages(raw.headers["X-Mibyan-Session"])
    finally:
        store.close()
    assert [m["content"] for m in stored] == ["hi", "hello", "again", "bonjour"]


def test_a_message_whose_run_fails_is_marked_failed_and_never_run_again(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    write_config(home, {"local": server.base_url}, [MEEPA])
    store = SessionStore.open(home)
    poison = {"text": "hi", "history": [assistant(tool_calls="garbage")], "one_off": True}
    Ledger(store).record_inbound("meepa/api#left-by-an-older-gateway", "k-1", poison)  # as if accepted
    store.close()

    def states() -> list[str]:
        with SessionStore.open(home) as opened:
            return [str(row[0]) for row in opened.query("SELECT status FROM gateway_inbox")]

    with start_gateway(home) as first:
        assert wait_until(lambda: states() == ["failed"])
        assert first.terminate() == 0
    with start_gateway(home) as second:
        assert second.terminate() == 0

    log = (home / "logs" / "gateway.log").read_text()
    assert log.count("tool_calls: must be a list of tool calls") == 1, log
    assert "Traceback" not in log and server.requests == []
    assert states() == ["failed"]
