"""`gateway.approvals: ask` over HTTP: the question is the reply, the channel's next message answers (a
gateway served in this process: tests/gatewaying.py InProcessGateway)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from gatewaying import InProcessGateway, write_config
from loopback import Reply, ScriptedServer, user_texts
from test_gateway import MEEPA, ask

from agent_state import SessionStore

CLEAN = Reply(tool_calls=[("terminal", {"command": "rm -rf build"})])


@pytest.fixture
def build(home: Path) -> Path:
    folder = home / "agents" / "meepa" / "workspace" / "build"  # the agent's commands run in its workspace
    folder.mkdir(parents=True)
    (folder / "out.o").write_text("object code")
    return folder


def start(start_gateway: Any, server: ScriptedServer, home: Path, timeout: float = 60) -> InProcessGateway:
    write_config(home, {"local": server.base_url}, [MEEPA], gateway={"approvals": "ask"})
    config = home / "config.yaml"
    config.write_text(config.read_text() + f"approvals:\n  timeout: {timeout}\n")
    gateway: InProcessGateway = start_gateway(home)
    return gateway


@pytest.fixture
def gateway(start_gateway: Any, server: ScriptedServer, home: Path) -> Iterator[InProcessGateway]:
    with start(start_gateway, server, home) as running:
        yield running


def text(raw: object) -> str:
    return str(raw.parse().choices[0].message.content)  # type: ignore[attr-defined]


def test_the_question_is_the_reply_and_approve_lets_the_command_run(
    gateway: InProcessGateway, server: ScriptedServer, build: Path
) -> None:
    server.add(CLEAN, Reply(text="The build folder is gone."))

    question = text(ask(gateway, "clean the build folder", channel="lee"))
    assert build.exists() and "rm -rf build" in question and "/approve" in question

    answered = ask(gateway, "/approve", channel="lee")

    assert text(answered) == "The build folder is gone."
    assert not build.exists()
    stored = SessionStore.open(gateway.home).load_messages(answered.headers["X-Mibyan-Session"])
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert user_texts({"messages": stored}) == ["clean the build folder"]


def test_deny_refuses_the_command(gateway: InProcessGateway, server: ScriptedServer, build: Path) -> None:
    server.add(CLEAN, Reply(text="I left it alone."))
    ask(gateway, "clean the build folder", channel="lee")

    answered = text(ask(gateway, "/deny", channel="lee"))

    assert answered == "I left it alone."
    assert build.exists()
    tool_result = server.requests[1].body["messages"][-1]
    assert tool_result["role"] == "tool" and "denied" in tool_result["content"]


def test_another_message_meanwhile_is_told_to_answer_first(
    gateway: InProcessGateway, server: ScriptedServer, build: Path
) -> None:
    server.add(CLEAN, Reply(text="hello, other"), Reply(text="done"))
    ask(gateway, "clean the build folder", channel="lee")

    reminder = text(ask(gateway, "what is the weather?", channel="lee"))
    elsewhere = text(ask(gateway, "hello", channel="other"))  # other channels are not held up

    assert reminder.startswith("Answer /approve or /deny first") and "rm -rf build" in reminder
    assert elsewhere == "hello, other"
    assert text(ask(gateway, "/approve", channel="lee")) == "done"
    assert [user_texts(r.body)[-1] for r in server.requests] == [
        "clean the build folder",
        "hello",
        "clean the build folder",
    ]


def test_no_answer_in_time_denies_and_the_next_reply_says_so(
    server: ScriptedServer, home: Path, build: Path, start_gateway: Any
) -> None:
    server.add(CLEAN, Reply(text="I could not clean it."), Reply(text="Hello!"))
    with start(start_gateway, server, home, timeout=1) as gateway:
        ask(gateway, "clean the build folder", channel="lee")
        assert server.wait_for_requests(2)  # the run went on without the command

        later = text(ask(gateway, "hello", channel="lee"))

    assert build.exists()
    assert later.startswith("Nobody approved `rm -rf build` within 1 s, so it did not run.")
    assert "I could not clean it." in later and later.endswith("Hello!")


def test_by_default_a_dangerous_command_is_refused_with_a_result_saying_so(
    server: ScriptedServer, home: Path, build: Path, start_gateway: Any
) -> None:
    write_config(home, {"local": server.base_url}, [MEEPA])
    server.add(CLEAN, Reply(text="I was not allowed to."))
    with start_gateway(home) as gateway:
        answer = text(ask(gateway, "clean the build folder", channel="lee"))

    assert answer == "I was not allowed to."
    assert build.exists()
    tool_result = server.requests[1].body["messages"][-1]
    assert tool_result["role"] == "tool" and "not run" in tool_result["content"]
    assert "refused: this gateway does not run dangerous commands (gateway.approvals: deny)" in str(
        tool_result["content"]
    )
    assert "--yolo" not in tool_result["content"]


def test_repeating_the_asking_request_gets_the_question_again(
    gateway: InProcessGateway, server: ScriptedServer, build: Path
) -> None:
    server.add(CLEAN, Reply(text="gone"))
    first = text(ask(gateway, "clean the build folder", channel="lee", key="m-1"))

    again = text(ask(gateway, "clean the build folder", channel="lee", key="m-1"))

    assert again == first and "/approve" in again
    assert len(server.requests) == 1
    assert text(ask(gateway, "/approve", channel="lee")) == "gone"


def test_without_a_channel_nobody_is_asked_and_the_refusal_says_how_to_be(
    gateway: InProcessGateway, server: ScriptedServer, build: Path
) -> None:
    server.add(CLEAN, Reply(text="I could not clean it."))

    answer = text(ask(gateway, "clean the build folder"))  # no channel could ever send its /approve

    assert answer == "I could not clean it."
    assert build.exists()
    refusal = server.requests[1].body["messages"][-1]["content"]
    assert refusal.startswith("refused: this gateway asks") and "X-Mibyan-Channel" in refusal
    assert "--yolo" not in refusal


def test_a_subagents_dangerous_command_is_asked_in_the_channel_too(
    gateway: InProcessGateway, server: ScriptedServer, build: Path
) -> None:
    server.add(
        Reply(tool_calls=[("delegate_task", {"goal": "clean the build folder"})]),
        CLEAN,  # the subagent's
        Reply(text="cleaned"),
        Reply(text="My subagent cleaned it."),
    )

    question = text(ask(gateway, "clean the build folder", channel="lee"))
    assert build.exists() and "rm -rf build" in question and "/approve" in question

    assert text(ask(gateway, "/approve", channel="lee")) == "My subagent cleaned it."
    assert not build.exists()
    child_result = server.requests[2].body["messages"][-1]
    assert child_result["role"] == "tool" and "denied" not in child_result["content"]


def test_by_default_a_subagents_dangerous_command_is_refused_by_the_gateways_policy(
    server: ScriptedServer, home: Path, build: Path, start_gateway: Any
) -> None:
    write_config(home, {"local": server.base_url}, [MEEPA])
    server.add(
        Reply(tool_calls=[("delegate_task", {"goal": "clean the build folder"})]),
        CLEAN,
        Reply(text="not allowed"),
        Reply(text="My subagent was not allowed to."),
    )
    with start_gateway(home) as gateway:
        assert (
            text(ask(gateway, "clean the build folder", channel="lee")) == "My subagent was not allowed to."
        )

    assert build.exists()
    refusal = server.requests[2].body["messages"][-1]["content"]
    assert "refused: this gateway does not run dangerous commands (gateway.approvals: deny)" in refusal


def test_the_models_clarify_question_is_asked_in_the_channel_and_its_next_message_answers(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    write_config(home, {"local": server.base_url}, [MEEPA])  # whatever approvals says
    server.add(
        Reply(
            text="One thing first.",
            tool_calls=[("clarify", {"question": "Which colour?", "choices": ["red", "blue"]})],
        ),
        Reply(text="Painted blue."),
    )
    with start_gateway(home) as gateway:
        question = text(ask(gateway, "paint the fence", channel="lee"))
        answered = ask(gateway, "blue, please", channel="lee")

    assert question.startswith("One thing first.") and "Which colour?" in question and "red, blue" in question
    assert text(answered) == "Painted blue."
    assert server.requests[1].body["messages"][-1] == {
        "role": "tool",
        "content": "blue, please",
        "tool_call_id": "call_1",
        "name": "clarify",
    }
    stored = SessionStore.open(home).load_messages(answered.headers["X-Mibyan-Session"])
    assert user_texts({"messages": stored}) == ["paint the fence"]


def test_a_clarify_question_nobody_answers_lets_the_model_go_on_and_the_next_reply_says_so(
    server: ScriptedServer, home: Path, start_gateway: Any
) -> None:
    server.add(
        Reply(tool_calls=[("clarify", {"question": "Which colour?"})]),
        Reply(text="I painted it white."),
        Reply(text="Hello!"),
    )
    with start(start_gateway, server, home, timeout=0.2) as gateway:
        ask(gateway, "paint the fence", channel="lee")
        assert server.wait_for_requests(2)

        later = text(ask(gateway, "hello", channel="lee"))

    assert "Nobody answered" in server.requests[1].body["messages"][-1]["content"]
    assert later.startswith("Nobody answered my question within 0.2 s, so I went on without an answer.")
    assert "I painted it white." in later and later.endswith("Hello!")


def test_an_answer_when_no_question_waits_is_refused_and_not_run(
    gateway: InProcessGateway, server: ScriptedServer, build: Path
) -> None:
    server.add(CLEAN, Reply(text="The build folder is gone."))

    with pytest.raises(openai.ConflictError) as before:  # nothing was asked yet
        ask(gateway, "/approve", channel="lee")
    ask(gateway, "clean the build folder", channel="lee")
    assert text(ask(gateway, "/approve", channel="lee")) == "The build folder is gone."
    with pytest.raises(openai.ConflictError) as after:  # answered already
        ask(gateway, "/deny", channel="lee")

    for refused in (before.value, after.value):
        assert refused.status_code == 409
        assert refused.body == {
            "message": "nothing on the channel 'lee' is waiting for an answer",
            "type": "invalid_request_error",
            "code": "nothing_to_answer",
        }
    assert len(server.requests) == 2  # neither reached the model
