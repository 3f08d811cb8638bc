"""The matrix connector against a real Synapse: a real `mibyan gateway`, matrix-nio as the people in the
rooms, the scripted model behind the agent."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from gatewaying import RunningGateway, write_config
from loopback import Reply, ScriptedServer
from synapsing import Synapse, User, joined, missing_reason

pytestmark = pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason()))

MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "meepa-model"}
PASSWORD = "bot-password"
_bots = itertools.count()


@pytest.fixture(scope="session")
def synapse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Synapse]:
    homeserver = Synapse(tmp_path_factory.mktemp("synapse"))
    yield homeserver
    homeserver.kill()


def _user(synapse: Synapse, name: str) -> Iterator[User]:
    user = User(synapse, name)
    yield user
    user.close()


@pytest.fixture(scope="session")
def alice(synapse: Synapse) -> Iterator[User]:
    yield from _user(synapse, "alice")


@pytest.fixture(scope="session")
def carol(synapse: Synapse) -> Iterator[User]:
    yield from _user(synapse, "carol")


@pytest.fixture(scope="session")
def mallory(synapse: Synapse) -> Iterator[User]:
    yield from _user(synapse, "mallory")


def user_texts(body: dict[str, Any]) -> list[str]:
    texts = []
    for message in body["messages"]:
        if message["role"] == "user":
            content = message["content"]
            texts.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
    return texts


def echo(body: dict[str, Any]) -> Reply:
    """The model answers with how many user messages its session holds, and the last one."""
    texts = user_texts(body)
    return Reply(text=f"echo {len(texts)}: {texts[-1]}")


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(default=echo) as scripted:
        yield scripted


def new_bot(synapse: Synapse, *, exempt: bool = True) -> str:
    """A fresh bot account (each test its own: no test sees another's rooms); rate limits lifted unless
    the test is about them."""
    name = f"meepa{os.getpid()}x{next(_bots)}"
    synapse.register(name, PASSWORD)
    user_id = f"@{name}:localhost"
    if exempt:
        synapse.exempt(user_id)
    return user_id


def start(
    home: Path,
    server: ScriptedServer,
    synapse: Synapse,
    bot: str,
    *,
    allow: list[str] | None = None,
    gateway: dict[str, Any] | None = None,
) -> RunningGateway:
    connector = {
        "name": "team",
        "kind": "matrix",
        "homeserver": synapse.url,
        "user_id": bot,
        "password_env": "MIBYAN_MATRIX_PASSWORD",
        "allow": allow or ["@alice:localhost", "@carol:localhost"],
    }
    write_config(home, {"local": server.base_url}, [MEEPA], connectors=[connector], gateway=gateway)
    return RunningGateway(home, env={"MIBYAN_MATRIX_PASSWORD": PASSWORD})


def dm(user: User, bot: str) -> str:
    """A direct room with the bot, once the bot has accepted the invitation."""
    room = user.room(bot, direct=True, name="dm")
    assert wait_until(lambda: joined(user, room, bot)), "the bot did not join"
    return room


def replies(user: User, room: str, bot: str, count: int, timeout: float = 30) -> list[dict[str, Any]]:
    """The bot's messages in the room once there are `count` of them (fails if they never come)."""
    found = wait_until(lambda: m if len(m := user.messages(room, bot)) >= count else None, timeout)
    assert found, f"expected {count} replies from the bot, got {user.messages(room, bot)}"
    return list(found)


def bodies(events: list[dict[str, Any]]) -> list[str]:
    return [str(event["content"]["body"]) for event in events]


def answered(event: dict[str, Any]) -> str | None:
    relation = event["content"].get("m.relates_to", {})
    return relation.get("m.in_reply_to", {}).get("event_id")


def test_one_message_one_reply_in_the_same_room_thread_and_session(
    home: Path, server: ScriptedServer, synapse: Synapse, alice: User, carol: User, mallory: User
) -> None:
    bot = new_bot(synapse)
    with start(home, server, synapse, bot) as gateway:
        assert f"mibyan gateway: team (matrix) on {synapse.url}\n" in gateway.lines
        room = dm(alice, bot)
        hello = alice.send(room, "hello **there**")
        [reply] = replies(alice, room, bot, 1)
        assert reply["content"]["body"] == "echo 1: hello **there**"
        assert answered(reply) == hello
        assert "<strong>there</strong>" in reply["content"]["formatted_body"]

        # a thread is its own channel: its own session, and the reply stays in the thread
        alice.send(room, "in the thread", thread=hello)
        threaded = replies(alice, room, bot, 2)[1]
        assert threaded["content"]["body"] == "echo 1: in the thread"
        assert threaded["content"]["m.relates_to"]["rel_type"] == "m.thread"
        assert threaded["content"]["m.relates_to"]["event_id"] == hello

        # the room's own session goes on where it was
        alice.send(room, "again")
        assert bodies(replies(alice, room, bot, 3))[2] == "echo 2: again"

        # a group room: its own session; answered only when mentioned; a stranger never reaches the model
        group = alice.room(bot, "@carol:localhost", "@mallory:localhost", name="group")
        carol.join(group)
        mallory.join(group)
        assert wait_until(lambda: joined(alice, group, bot))
        alice.send(group, "not for the bot")
        mallory.send(group, f"{bot}: tell me the secret", mention=bot)
        alice.send(group, f"{bot}: hi", mention=bot)
        assert bodies(replies(alice, group, bot, 1)) == ["echo 1: hi"]

        # two users never see each other's context
        carols = dm(carol, bot)
        carol.send(carols, "carol here")
        assert bodies(replies(carol, carols, bot, 1)) == ["echo 1: carol here"]

    seen = [text for request in server.requests for text in user_texts(request.body)]
    assert not any("secret" in text or "not for the bot" in text for text in seen)
    carol_request = next(r for r in server.requests if "carol here" in user_texts(r.body))
    assert user_texts(carol_request.body) == ["carol here"]
    assert len(server.requests) == 5
