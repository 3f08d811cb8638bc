"""The xmpp connector against a real Prosody: a real `mibyan gateway`, slixmpp as the people, the
scripted model behind the agent."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from gatewaying import RunningGateway, write_config
from loopback import Reply, ScriptedServer, echo, user_texts
from prosodying import ROOMS, Prosody, User, missing_reason

pytestmark = [
    pytest.mark.chat_servers,
    pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason())),
]

MEEPA = {"id": "meepa", "default": True, "provider": "local", "model": "meepa-model"}
PASSWORD = "bot-password"
ENV = {"MIBYAN_XMPP_PASSWORD": PASSWORD}
_bots = itertools.count()


@pytest.fixture(scope="module")
def prosody(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prosody]:
    server = Prosody(tmp_path_factory.mktemp("prosody"))
    yield server
    server.kill()


@pytest.fixture(scope="module")
def alice(prosody: Prosody) -> Iterator[User]:
    user = User(prosody, "alice")
    yield user
    user.close()


@pytest.fixture(scope="module")
def mallory(prosody: Prosody) -> Iterator[User]:
    user = User(prosody, "mallory")
    yield user
    user.close()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer(default=echo) as scripted:
        yield scripted


def new_bot(prosody: Prosody) -> str:
    return prosody.register(f"meepa{os.getpid()}x{next(_bots)}", PASSWORD)


def start(
    home: Path,
    server: ScriptedServer,
    prosody: Prosody,
    bot: str,
    rooms: list[str] = (),
    gateway: dict[str, Any] | None = None,
) -> RunningGateway:
    (home / "ca.pem").write_bytes(prosody.ca_file.read_bytes())
    connector = {
        "name": "chat",
        "kind": "xmpp",
        "jid": bot,
        "password_env": "MIBYAN_XMPP_PASSWORD",
        "server": {"host": "127.0.0.1", "port": prosody.port},
        "ca_file": "ca.pem",
        "allow": ["alice@localhost", "carol@localhost"],
        "rooms": list(rooms),
        "nick": "meepa",
    }
    write_config(home, {"local": server.base_url}, [MEEPA], connectors=[connector], gateway=gateway)
    return RunningGateway(home, env=ENV)


def replies(user: User, sender: str, count: int, timeout: float = 30) -> list[str]:
    found = wait_until(lambda: t if len(t := user.texts(sender)) >= count else None, timeout)
    assert found, f"expected {count} replies from {sender}, got {user.texts(sender)}"
    return list(found)


def test_a_direct_message_is_answered_once_a_room_on_mention_and_strangers_never(
    home: Path, server: ScriptedServer, prosody: Prosody, alice: User, mallory: User
) -> None:
    bot = new_bot(prosody)
    room = f"team{next(_bots)}@{ROOMS}"
    with start(home, server, prosody, bot, rooms=[room]) as gateway:
        assert f"mibyan gateway: chat (xmpp) on {bot}\n" in gateway.lines
        alice.send(bot, "hello")
        assert replies(alice, bot, 1) == ["echo 1: hello"]
        alice.send(bot, "again")
        assert replies(alice, bot, 2)[1] == "echo 2: again"

        mallory.send(bot, "tell me the secret")
        alice.join(room)
        mallory.join(room)
        alice.send(room, "not for the bot", group=True)
        mallory.send(room, "meepa: the secret now", group=True)
        alice.send(room, "meepa: hi", group=True)
        assert replies(alice, f"{room}/meepa", 1) == ["echo 1: hi"]  # the room's own session

        server.add(Reply(text="\n".join(f"line {n:05d} " + "é" * 30 for n in range(320))))
        alice.send(bot, "long please")
        long = "\n".join(f"line {n:05d} " + "é" * 30 for n in range(320))
        assert len(long.encode()) > 20_000
        parts = wait_until(lambda: "\n".join(alice.texts(bot)[2:]) == long or None, 30)
        assert parts, alice.texts(bot)[2:]
        assert len(alice.texts(bot)) > 3  # sent in parts
        assert not mallory.texts(bot)
    seen = [text for request in server.requests for text in user_texts(request.body)]
    assert not any("secret" in text or "not for the bot" in text for text in seen)
    assert len(server.requests) == 4


def test_killed_and_restarted_messages_sent_meanwhile_are_answered_once(
    home: Path, server: ScriptedServer, prosody: Prosody, alice: User
) -> None:
    bot = new_bot(prosody)
    alice.send(bot, "from before the first start")
    server.add(Reply(text="the first run never finishes", delay=60))
    first = start(home, server, prosody, bot)
    alice.send(bot, "mid-run")
    assert wait_until(lambda: len(server.requests) == 1)
    first.kill()
    alice.send(bot, "while down 1")
    alice.send(bot, "while down 2")
    with RunningGateway(home, env=ENV):
        texts = replies(alice, bot, 3)
        assert sorted(texts) == sorted(["echo 1: mid-run", "echo 2: while down 1", "echo 3: while down 2"])
    assert len(alice.texts(bot)) == 3
    seen = [text for request in server.requests for text in user_texts(request.body)]
    assert not any("from before" in text for text in seen)


def test_prosody_restarted_under_the_gateway_the_next_message_is_answered(
    home: Path, server: ScriptedServer, tmp_path: Path
) -> None:
    prosody = Prosody(tmp_path)  # its own: the module's people stay connected to theirs
    try:
        bot = new_bot(prosody)
        with start(home, server, prosody, bot):
            prosody.restart()
            carol = User(prosody, "carol")
            try:
                carol.send(bot, "after the restart")
                assert replies(carol, bot, 1, timeout=30) == ["echo 1: after the restart"]
            finally:
                carol.close()
    finally:
        prosody.kill()


def test_a_file_sent_by_http_upload_is_saved_to_the_inbox_capped_and_the_agent_told(
    home: Path, server: ScriptedServer, prosody: Prosody, alice: User
) -> None:
    bot = new_bot(prosody)
    with start(home, server, prosody, bot, gateway={"max_attachment_mb": 0.001}):  # 1,000 bytes
        alice.send_file(bot, "notes.txt", b"remember the milk")
        [told] = replies(alice, bot, 1)
        alice.send_file(bot, "big.txt", b"x" * 5000)
        too_large = replies(alice, bot, 2)[1]
    inbox = home / "agents" / "meepa" / "workspace" / "inbox"
    [saved] = list(inbox.glob("*-notes.txt"))
    assert saved.read_bytes() == b"remember the milk"
    assert not list(inbox.glob("*big.txt"))
    assert told == f"echo 1: [the sender attached a file, saved as inbox/{saved.name} (17 bytes)]"
    assert too_large.startswith(
        "echo 2: [the sender attached a file, big.txt (5,000 bytes): over the 0.001 MB"
    )
    seen = [text for request in server.requests for text in user_texts(request.body)]
    assert not any("http" in text for text in seen)  # the agent reads where the file is, not its URL


def test_in_chat_commands_approve_answers_a_question_and_new_starts_a_fresh_session(
    home: Path, server: ScriptedServer, prosody: Prosody, alice: User
) -> None:
    bot = new_bot(prosody)
    build = home / "agents" / "meepa" / "workspace" / "build"
    build.mkdir(parents=True)
    server.add(
        Reply(tool_calls=[("terminal", {"command": "rm -rf build"})]), Reply(text="The build is gone.")
    )

    def answers() -> list[str]:  # without the run's status line (corrected in place)
        return [text for text in alice.texts(bot) if not text.startswith("⚙")]

    def answered(count: int) -> list[str]:
        found = wait_until(lambda: a if len(a := answers()) >= count else None, 30)
        assert found, answers()
        return list(found)

    with start(home, server, prosody, bot, gateway={"approvals": "ask"}):
        alice.send(bot, "clean the build folder")
        [question] = answered(1)
        assert "rm -rf build" in question and build.exists()
        alice.send(bot, "/approve")
        assert answered(2)[1] == "The build is gone."
        assert not build.exists()
        alice.send(bot, "one")
        assert answered(3)[2] == "echo 2: one"  # the same session as the cleanup
        alice.send(bot, "/help")
        alice.send(bot, "/status")
        alice.send(bot, "/new")
        alice.send(bot, "two")
        got = answered(7)
    assert "/stop" in got[3] and "/new" in got[3]
    assert got[4].startswith("Agent meepa, ") and "meepa/chat/alice@localhost" in got[4]
    assert got[5].startswith("Done: your next message starts a fresh session")
    assert got[6] == "echo 1: two"
    seen = [text for request in server.requests for text in user_texts(request.body)]
    assert not any(text.startswith("/") for text in seen)  # commands never reach the model


def test_a_runs_tools_show_as_one_status_message_corrected_in_place_above_the_answer(
    home: Path, server: ScriptedServer, prosody: Prosody, alice: User
) -> None:
    bot = new_bot(prosody)
    server.add(
        Reply(tool_calls=[("terminal", {"command": "echo one"})]),
        Reply(tool_calls=[("terminal", {"command": "echo two"})]),
        Reply(text="Both ran."),
    )
    with start(home, server, prosody, bot):
        alice.send(bot, "run them")
        got = replies(alice, bot, 2)
        assert wait_until(lambda: alice.texts(bot)[-1] == "Both ran.")
    stanzas = [stanza for stanza in alice.received if str(stanza["from"].bare) == bot]
    status, *corrections, answer = stanzas
    assert str(status["body"]) == "⚙ terminal: `echo one`"
    replaced = [c.xml.find("{urn:xmpp:message-correct:0}replace") for c in corrections]
    assert corrections and all(r is not None and r.get("id") == status["id"] for r in replaced)
    assert str(corrections[-1]["body"]) == "⚙ terminal ×2"  # left as the summary of what ran
    assert (
        str(answer["body"]) == "Both ran." and answer.xml.find("{urn:xmpp:message-correct:0}replace") is None
    )
    assert got[0] == "⚙ terminal: `echo one`"
